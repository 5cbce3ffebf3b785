"""FileBackend: one JSON record per key in a directory, for one host."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..errors import BackendError, CorruptRecordError
from ._records import Record, Slot, SlotBackend
from ._stripes import Stripes

__all__ = ["FileBackend"]

log = logging.getLogger(__name__)


class FileBackend(SlotBackend):
    """Locks kept as files under ``directory``, safe across processes on one host.

    Each key's record is written atomically (a whole file, then ``os.replace``
    onto the record's name) under a ``flock`` that guards a stripe of keys, so
    a process killed mid-write leaves the old record or the new one, never
    half. A record that cannot be read raises :class:`CorruptRecordError`
    naming the file; it is never taken for a free lock.

    The file written and then renamed is one of two spares per stripe
    (``.NNa.spare``, ``.NNb.spare``), and a record that is replaced or deleted
    becomes a spare in turn (by a hard link made before the rename or the
    unlink). So a transition neither creates nor frees an inode: on an ext4
    mounted with ``discard`` a file created where one was just freed costs
    more than all the rest of a lock cycle together. A spare is only ever
    written while it is no record's other name (its link count is checked).
    Nothing is fsynced, as before: a power cut can leave a record older than
    its last write.
    """

    name = "file"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.timeout = timeout
        self.clock = clock
        self._dir = str(self.directory)
        self._spare_paths: dict[int, list[str]] = {}
        self._stripes = Stripes(self.directory, timeout, self.name)

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r})"

    def _load(self, path: str, key: str | None) -> Record | None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptRecordError(path, str(exc)) from exc
        try:
            raw = _read_all(fd)
        except OSError as exc:
            raise CorruptRecordError(path, str(exc)) from exc
        finally:
            os.close(fd)
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise CorruptRecordError(path, f"not valid JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise CorruptRecordError(path, "not a uniqjob lock record")
        if key is not None and record["key"] != key:
            raise CorruptRecordError(path, f"holds key {record['key']!r}, expected {key!r}")
        return record

    def _spares(self, stripe: int) -> list[str]:
        """The stripe's two spare paths: the one last seen holding an inode first, the vacant one last.

        Only a guess (other processes use them too) that saves a failed call when right.
        """
        spares = self._spare_paths.get(stripe)
        if spares is None:
            spares = self._spare_paths[stripe] = [
                os.path.join(self._dir, f".{stripe:02d}{s}.spare") for s in "ab"
            ]
        return spares

    def _store(self, path: str, stripe: int, record: Record | None, existed: bool) -> None:
        """Write ``record`` (None: delete it) at ``path``; the stripe's lock is held."""
        spares = self._spares(stripe)
        if record is None:
            if existed:
                kept = self._keep(path, spares, None)
                with suppress(FileNotFoundError):
                    os.unlink(path)
                if kept is not None:
                    spares.sort(key=lambda spare: spare != kept)
            return
        filled = self._fill(spares, json.dumps(record, separators=(",", ":")).encode("utf-8"))
        kept = self._keep(path, spares, filled) if existed else None
        try:
            os.replace(filled, path)
        except BaseException:
            if kept is not None:  # else the spare would stay a second name of the live record
                with suppress(OSError):
                    os.unlink(kept)
            raise
        spares.sort(key=lambda spare: spare == filled)  # it is the vacant one now

    @staticmethod
    def _fill(spares: list[str], data: bytes) -> str:
        """Write ``data`` into a spare (made if there is none) and return its path."""
        for spare in spares:
            try:
                fd = os.open(spare, os.O_WRONLY | _OPEN_FLAGS)
            except FileNotFoundError:
                continue
            try:
                stat = os.fstat(fd)
                if stat.st_nlink != 1:
                    # Still another name of a record: a crash came between the link and the rename.
                    os.unlink(spare)
                    continue
                _write_all(fd, data)
                if stat.st_size > len(data):
                    os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
            return spare
        spare = spares[0]
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o666)
        try:
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            with suppress(OSError):
                os.unlink(spare)
            raise
        os.close(fd)
        return spare

    @staticmethod
    def _keep(path: str, spares: list[str], busy: str | None) -> str | None:
        """Give the inode at ``path`` a free spare's name, so replacing or deleting it frees nothing."""
        for spare in reversed(spares):
            if spare == busy:
                continue
            try:
                os.link(path, spare)
            except FileExistsError:
                continue
            except OSError:  # no hard links here (or too many): the inode is simply freed
                return None
            return spare
        return None

    @contextmanager
    def _slot(self, key: str) -> Iterator[Slot]:
        path, stripe = self._stripes.of(key)
        with self._stripes.locked(stripe):
            record = self._load(path, key)
            slot = Slot(key, record, self.clock())
            yield slot
            if slot.changed:
                try:
                    self._store(path, stripe, slot.record(), record is not None)
                except OSError as exc:
                    raise BackendError(f"cannot write {path}: {exc}", self.name) from exc

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

    def scan(self) -> Iterator[str]:
        try:
            entries = os.scandir(self.directory)
        except OSError as exc:
            raise BackendError(f"cannot list {self.directory}: {exc}", self.name) from exc
        with entries:
            for entry in entries:
                name = entry.name
                if not name.endswith(".json") or name.startswith("."):
                    continue
                try:
                    # Under its stripe's lock: a spare being rewritten in place may
                    # still be open to a reader that found it under a record's name.
                    with self._stripes.locked(Stripes.of_name(name)):
                        record = self._load(entry.path, None)
                    if record is not None and self._stripes.of(record["key"])[0] != entry.path:
                        raise CorruptRecordError(entry.path, f"holds key {record['key']!r} of another file")
                except (CorruptRecordError, ValueError) as exc:
                    log.warning("skipping %s", exc)
                    continue
                if record is not None:
                    yield record["key"]


_OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, size: int = 65536) -> bytes:
    # A regular file returns less than asked only at its end: one read() for a record.
    chunk = os.read(fd, size)
    if len(chunk) < size:
        return chunk
    chunks = [chunk]
    while chunk:
        chunk = os.read(fd, size)
        chunks.append(chunk)
    return b"".join(chunks)
