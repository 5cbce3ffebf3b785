"""The file store: one JSON record per key in a directory, for one host.

Locks (:class:`FileBackend`) and, in its ``concurrency/`` directory, semaphores
(:class:`FileSemaphores`)."""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import unquote

from ..errors import BackendError, ConfigurationError, CorruptRecordError
from ._files import RecordFiles, write_all
from ._machine import Machine, MachineStore
from ._machine import Record as SemaphoreRecord
from ._machine import record_problem as semaphore_problem
from ._records import Record, Slot, SlotBackend, record_problem
from ._stripes import FILE_MODE, OPEN_FLAGS, Stripes, describe_error, file_problem
from ._urls import Invalid, bad, options, seconds, split
from .semaphores import SemaphoreStore

__all__ = ["FILE_URL_OPTIONS", "FileBackend", "FileSemaphores", "from_url"]

#: The query options a ``file://`` URL may carry.
FILE_URL_OPTIONS: dict[str, str] = {
    "timeout": "seconds to wait for the file lock of a key's stripe (default 30)",
}

log = logging.getLogger(__name__)


class FileBackend(SlotBackend):
    """Locks kept as files under ``directory``, safe across processes on one host.

    Each key's record is written atomically (a whole file, then ``os.replace``
    onto the record's name) under a ``flock`` that guards a stripe of keys, so
    a process killed mid-write leaves the old record or the new one, never
    half. A record that cannot be read, or whose fields have the wrong type or
    shape, raises :class:`CorruptRecordError` naming the file; it is never
    taken for a free lock, and :meth:`purge` removes it.

    The file written and then renamed is one of two spares per stripe
    (``.NNa.spare``, ``.NNb.spare``), and a record that is replaced or deleted
    becomes a spare in turn (by a hard link made before the rename or the
    unlink). So a transition neither creates nor frees an inode (why:
    docs/performance.md). A spare is only ever
    written while it is no record's other name (its link count is checked).
    Nothing is fsynced, as before: a power cut can leave a record older than
    its last write.

    Fences: each stripe keeps the last fence it issued in ``.NN.fence``, so a
    fence outlives its key's record (which goes with its last lock) without
    a file per key: a new one is greater than every fence of any key of the
    stripe, and so of its own. These files are never deleted.

    The directory must be this user's, and not writable by others unless
    sticky (see :func:`~uniqjob.stores._stripes.private_directory`); every
    file is opened with ``O_NOFOLLOW`` and must be a regular file of this
    user's, and files are made ``0o600``, whatever the umask.
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
        if os.path.realpath(self.directory) == os.path.realpath("/"):
            raise ConfigurationError(
                f"the file store cannot be {str(self.directory)!r}, the root directory: its lock files "
                "would go into / itself; give it a directory of its own, e.g. file:///var/lib/myapp/locks"
            )
        self.timeout = timeout
        self.clock = clock
        self._dir = str(self.directory)
        self._spare_paths: dict[int, list[str]] = {}
        self._stripes = Stripes(self.directory, timeout, self.name)
        self._files = RecordFiles(self._stripes, "lock", record_problem, hint_key=True)

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r})"

    def semaphores(self) -> SemaphoreStore:
        """A new semaphore store in this directory's ``concurrency/``, on this backend's timeout and clock."""
        clock = lambda: self.clock()  # noqa: E731, PLW0108 - a clock swapped in later is followed
        return FileSemaphores(self.directory / "concurrency", timeout=self.timeout, clock=clock)

    def _fence(self, stripe: int, now_us: int) -> int:
        """Issue a fence for a key of ``stripe``, whose lock is held (see :meth:`Stripes.fence`)."""
        try:
            return self._stripes.fence(stripe, now_us)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else f"the fence file of stripe {stripe}"
            raise BackendError(f"cannot issue a fence: {describe_error(where, exc)}", self.name) from exc

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

    def _fill(self, spares: list[str], data: bytes) -> str:
        """Write ``data`` into a spare (made if there is none) and return its path."""
        for spare in spares:
            try:
                fd = os.open(spare, os.O_WRONLY | os.O_NONBLOCK | OPEN_FLAGS)
            except FileNotFoundError:
                continue
            try:
                stat = os.fstat(fd)
                problem = file_problem(stat)
                if problem:
                    raise BackendError(f"spare file {spare} is {problem}: remove it", self.name)
                if stat.st_nlink != 1:
                    # Still another name of a record: a crash came between the link and the rename.
                    os.unlink(spare)
                    continue
                write_all(fd, data)
                if stat.st_size > len(data):
                    os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
            return spare
        spare = spares[0]
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have taken bits from the mode given to open
            write_all(fd, data)
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
                os.link(path, spare, follow_symlinks=False)  # a link to the name, never through it
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
            record = self._files.load(path, key)
            slot = Slot(key, record, self.clock(), functools.partial(self._fence, stripe))
            yield slot
            if slot.changed:
                try:
                    self._store(path, stripe, slot.record(), record is not None)
                except OSError as exc:
                    raise self._files.write_error(path, exc) from exc

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

    def scan(self) -> Iterator[str]:
        """Yield the key of every record, a record with bad fields too (:meth:`read` then raises).

        A record too damaged to name its key is yielded by :meth:`corrupt` instead.
        """
        for record in self._files.records():
            yield record["key"]

    def corrupt(self) -> Iterator[CorruptRecordError]:
        yield from self._files.corrupt()

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record file, whatever it holds; return its path, or ``[]`` if there was none.

        ``key`` may also be the path of a record file in this directory, as a
        :class:`CorruptRecordError` names it, for a record that names no key.
        A symlink is removed, never followed. Fences are kept.
        """
        return self._files.purge(key)


class FileSemaphores(MachineStore):
    """Semaphores as JSON files under ``directory``, safe across processes on one host.

    One record per key, written atomically (temporary file, then
    ``os.replace``) under a ``flock`` guarding a stripe of keys (the file
    backend's stripe lock, kept open); a record that cannot be read, or whose
    fields have the wrong type or shape, raises :class:`CorruptRecordError`
    naming the file, and :meth:`purge` removes it. The temporary file is one
    per stripe (``.NN.tmp``), written only under its stripe's lock, so one
    that a crash left behind is simply made again by the next write.

    The directory is kept as private as the file backend's: this user's,
    files opened with ``O_NOFOLLOW``, modes ``0o700`` / ``0o600`` whatever the umask.
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
        self._stripes = Stripes(self.directory, timeout, self.name)
        # An unreadable record's error names no key: a purge by key (its hint) is for lock records.
        self._files = RecordFiles(self._stripes, "concurrency", semaphore_problem, hint_key=False)

    def __repr__(self) -> str:
        return f"FileSemaphores({str(self.directory)!r})"

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

    def _store(self, path: str, stripe: int, record: SemaphoreRecord | None) -> None:
        if record is None:
            with suppress(FileNotFoundError):
                os.unlink(path)
            return
        tmp = os.path.join(os.path.dirname(path), f".{stripe:02d}.tmp")  # ours alone while we hold the stripe
        fd = self._create(tmp)
        try:
            try:
                write_all(fd, json.dumps(record, separators=(",", ":")).encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise

    @staticmethod
    def _create(tmp: str) -> int:
        """Make ``tmp`` afresh, ``0o600``, never through whatever already has that name."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS
        try:
            fd = os.open(tmp, flags, FILE_MODE)
        except FileExistsError:
            os.unlink(tmp)  # a crash's leftover (or a planted link): the name goes, nothing it points to
            fd = os.open(tmp, flags, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have taken bits from the mode given to open
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextmanager
    def _machine(self, key: str, *, write: bool = True) -> Iterator[Machine]:
        path, stripe = self._stripes.of(key)
        with self._stripes.locked(stripe):
            m = Machine(key, self._files.load(path, key), self.clock())
            yield m
            if write and m.changed:
                try:
                    self._store(path, stripe, m.record())
                except OSError as exc:
                    raise self._files.write_error(path, exc) from exc

    def scan(self) -> Iterator[str]:
        """Yield every key that holds a slot or a parked call, and every key whose record has bad fields.

        For the latter :meth:`read` raises :class:`CorruptRecordError`; a record
        too damaged to name its key is yielded by :meth:`corrupt` instead.
        """
        for record in self._files.records():
            if semaphore_problem(record) or record["slots"] or record.get("parked"):
                yield record["key"]

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield an error for each record file that cannot be read as far as its key."""
        yield from self._files.corrupt()

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record file whatever it holds (or the record file at the path ``key``); return it.

        A symlink is removed, never followed; ``[]`` when there was nothing.
        """
        return self._files.purge(key)


def from_url(url: str) -> FileBackend:
    """The FileBackend of a ``file:///dir`` URL, checked first (options: :data:`FILE_URL_OPTIONS`)."""
    try:
        parts = split(url)
        given = options(parts, FILE_URL_OPTIONS)
    except Invalid as exc:
        raise bad("file", url, exc) from None
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise bad("file", url, "use file:///absolute/path/to/directory")
    path = unquote(parts.path)
    if "\x00" in path:
        raise bad("file", url, "the path holds a NUL byte (%00)")
    if os.path.normpath(path).strip("/") == "":
        raise bad(
            "file",
            url,
            "refusing / as a lock store (its .locks directory would go into the root directory); "
            "name a directory of its own, e.g. file:///var/lib/myapp/locks",
        )
    try:
        timeout = seconds("timeout", given["timeout"]) if "timeout" in given else None
    except Invalid as exc:
        raise bad("file", url, exc) from None
    return FileBackend(path) if timeout is None else FileBackend(path, timeout=timeout)
