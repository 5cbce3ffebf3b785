"""Record files: the ``<digest>.json`` file a file store keeps for each key, under its stripe's lock.

Both file stores (locks and concurrency semaphores) keep their records so,
and read, write, list and remove them here: never blocking on a planted FIFO,
never through a symlink, and naming the file in a :class:`CorruptRecordError`
whenever one cannot be read as far as its key. :meth:`RecordFiles.write` is
the one atomic writer of both.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import suppress

from ..errors import BackendError, CorruptRecordError
from ._schema import Record
from ._stripes import FILE_MODE, OPEN_FLAGS, Stripes, describe_error, file_problem, os_reason

__all__ = ["RECORD_NAME", "RecordFiles", "read_all", "write_all"]

RECORD_NAME = re.compile(r"[0-9a-f]{32}\.json")  # what Stripes.of names a key's record


class RecordFiles:
    """The record files of the directory that ``stripes`` guards.

    ``kind`` says whose records they are in errors ("lock", "concurrency");
    ``problem`` says what is wrong with a record whose key was read ("" if
    nothing). ``hint_key``: whether the error for a record that cannot be
    read as far as its key names the key it was read for (its message says to
    purge that key).
    """

    def __init__(
        self, stripes: Stripes, kind: str, problem: Callable[[Record], str], *, hint_key: bool
    ) -> None:
        self.stripes = stripes
        self.kind = kind
        self.problem = problem
        self.hint_key = hint_key
        self._dir = str(stripes.directory)
        self._spare_paths: dict[int, list[str]] = {}

    def _parse(self, path: str, key: str = "") -> Record | None:
        """Read the record at ``path`` as far as its key; None if there is none.

        Anything unreadable is a :class:`CorruptRecordError` naming the file (and ``key``, if given).
        """
        raw = self._read(path, key)
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecordError(path, f"not valid JSON ({exc})", key=key) from exc
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise CorruptRecordError(path, f"not a uniqjob {self.kind} record", key=key)
        return record

    def _read(self, path: str, key: str) -> bytes | None:
        """The bytes of the record file at ``path``; None if there is none, else CorruptRecordError."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)  # a planted FIFO never blocks us
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptRecordError(path, os_reason(exc), key=key) from exc
        try:
            # Where no other user may create files, each one is this user's: fstat() it only
            # where others may (a sticky directory), or when it reads empty (a FIFO does), to say why.
            raw = b"" if self.stripes.shared else read_all(fd)
            if not raw:
                problem = file_problem(os.fstat(fd))
                if problem:
                    raise CorruptRecordError(path, problem, key=key)
                raw = read_all(fd)
        except OSError as exc:
            raise CorruptRecordError(path, os_reason(exc), key=key) from exc
        finally:
            os.close(fd)
        return raw

    def load(self, path: str, key: str) -> Record | None:
        """Read ``key``'s record at ``path``, every field checked; None if there is none."""
        record = self._parse(path, key if self.hint_key else "")
        if record is None:
            return None
        if record["key"] != key:
            raise CorruptRecordError(path, f"holds key {record['key']!r}, expected {key!r}", key=key)
        problem = self.problem(record)
        if problem:
            raise CorruptRecordError(path, problem, key=key)
        return record

    def write(self, path: str, stripe: int, record: Record | None, *, existed: bool = True) -> None:
        """Store ``record`` at ``path`` (None: remove it), atomically; ``stripe``'s lock is held.

        ``existed``: whether a record was read there (when not, there is none to keep or remove).

        The whole record is written into a file that no record uses, which is
        then renamed onto the record's name: a process killed mid-write leaves
        the old record or the new one, never half. That file is one of two
        spares per stripe (``.NNa.spare``, ``.NNb.spare``), and a record that is
        replaced or deleted becomes a spare in turn (by a hard link made before
        the rename or the unlink), so a transition neither creates nor frees an
        inode (why: docs/performance.md). A spare is only ever written while it
        is no record's other name (its link count is checked); where there is
        none yet, the record is written into the stripe's ``.NN.tmp``, made
        afresh (a crash's leftover is simply made again). Nothing is fsynced: a
        power cut can leave a record older than its last write. A failure is a
        :class:`BackendError` naming the file.
        """
        try:
            self._write(path, stripe, record, existed)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else path
            reason = describe_error(where, exc)
            raise BackendError(f"cannot write {path}: {reason}", self.stripes.owner) from exc

    def _write(self, path: str, stripe: int, record: Record | None, existed: bool) -> None:
        spares = self._spares(stripe)
        if record is None:
            if not existed:
                return
            kept = _keep(path, spares, None)
            with suppress(FileNotFoundError):
                os.unlink(path)
            if kept is not None:
                spares.sort(key=lambda spare: spare != kept)
            return
        data = json.dumps(record, separators=(",", ":")).encode("utf-8")
        filled = self._fill(spares, data)
        made = None
        if filled is None:
            filled = made = _fresh(os.path.join(self._dir, f".{stripe:02d}.tmp"), data)
        kept = _keep(path, spares, filled) if existed else None
        try:
            os.replace(filled, path)
        except BaseException:
            # A kept spare would stay a second name of the live record; a file made here is debris.
            for left in (kept, made):
                if left is not None:
                    with suppress(OSError):
                        os.unlink(left)
            raise
        spares.sort(key=lambda spare: spare == filled)  # it is the vacant one now, if a spare

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

    def _fill(self, spares: list[str], data: bytes) -> str | None:
        """Write ``data`` into a spare that is no record's other name and return its path; None if none."""
        for spare in spares:
            try:
                fd = os.open(spare, os.O_WRONLY | os.O_NONBLOCK | OPEN_FLAGS)
            except FileNotFoundError:
                continue
            try:
                info = os.fstat(fd)
                problem = file_problem(info)
                if problem:
                    raise BackendError(f"spare file {spare} is {problem}: remove it", self.stripes.owner)
                if info.st_nlink != 1:
                    # Still another name of a record: a crash came between the link and the rename.
                    os.unlink(spare)
                    continue
                write_all(fd, data)
                if info.st_size > len(data):
                    os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
            return spare
        return None

    def records(self) -> Iterator[Record]:
        """Yield each record that can be read as far as its key (its fields not checked)."""
        return (record for record in self._each() if not isinstance(record, CorruptRecordError))

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield the error of each record file that cannot be read as far as its key."""
        return (error for error in self._each() if isinstance(error, CorruptRecordError))

    def _each(self) -> Iterator[Record | CorruptRecordError]:
        """Yield each record file's record (key read, fields not checked), or why it cannot be read."""
        try:
            entries = os.scandir(self.stripes.directory)
        except OSError as exc:
            raise BackendError(f"cannot list {self.stripes.directory}: {exc}", self.stripes.owner) from exc
        with entries:
            for entry in entries:
                if not RECORD_NAME.fullmatch(entry.name):
                    continue  # spares, fences, temporary and lock files, a subdirectory: no record
                try:
                    # Under its stripe's lock: never a record half written over (a spare being
                    # rewritten in place may still be open to a reader that found it under a record's name).
                    with self.stripes.locked(Stripes.of_name(entry.name)):
                        record = self._parse(entry.path)
                    if record is not None and self.stripes.of(record["key"])[0] != entry.path:
                        # Not where its key's record goes: purged by its path, never by that key.
                        raise CorruptRecordError(entry.path, f"holds key {record['key']!r} of another file")
                except CorruptRecordError as exc:
                    yield exc
                    continue
                if record is not None:
                    yield record

    def purge(self, key_or_path: str) -> list[str]:
        """Remove the record file of a key, or at a path in this directory, whatever it holds.

        Return its path, or ``[]`` if there was none. A symlink is removed, never followed.
        """
        path, stripe = self.locate(key_or_path)
        with self.stripes.locked(stripe):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise BackendError(f"cannot remove {describe_error(path, exc)}", self.stripes.owner) from exc
        return [path]

    def locate(self, key_or_path: str) -> tuple[str, int]:
        """The record file that ``key_or_path`` names (a key, or a record path here), and its stripe."""
        name = os.path.basename(key_or_path)
        here = os.path.abspath(os.path.dirname(key_or_path)) == os.path.abspath(self._dir)
        if here and RECORD_NAME.fullmatch(name):
            return os.path.join(self._dir, name), Stripes.of_name(name)
        return self.stripes.of(key_or_path)


def _fresh(tmp: str, data: bytes) -> str:
    """Make ``tmp`` afresh (``0o600``, never through whatever already has that name), holding ``data``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS
    try:
        fd = os.open(tmp, flags, FILE_MODE)
    except FileExistsError:
        os.unlink(tmp)  # a crash's leftover (or a planted link): the name goes, nothing it points to
        fd = os.open(tmp, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits from the mode given to open
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        with suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many calls it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int, size: int = 65536) -> bytes:
    """Read ``fd`` to its end."""
    # A regular file returns less than asked only at its end: one read() for a record.
    chunk = os.read(fd, size)
    if len(chunk) < size:
        return chunk
    chunks = [chunk]
    while chunk:
        chunk = os.read(fd, size)
        chunks.append(chunk)
    return b"".join(chunks)
