"""The file store: one JSON record per key in a directory, for one host.

Locks (:class:`FileBackend`) and, in its ``concurrency/`` directory, semaphores
(:class:`FileSemaphores`)."""

from __future__ import annotations

import functools
import os
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

from ..errors import BackendError, ConfigurationError, CorruptRecordError
from . import _drops
from ._droplog import DropLog
from ._files import RecordFiles
from ._schema import Record, lock_problem, semaphore_problem
from ._stripes import STRIPES, Stripes, describe_error
from ._template import Held, LockMachineBackend, MachineStore, RecordStore
from ._urls import Invalid, bad, options, seconds, split
from .semaphores import SemaphoreStore

__all__ = ["FILE_URL_OPTIONS", "FileBackend", "FileSemaphores", "from_url"]

#: The query options a ``file://`` URL may carry.
FILE_URL_OPTIONS: dict[str, str] = {
    "timeout": "seconds to wait for the file lock of a key's stripe (default 30)",
}


class _FileRecords(RecordStore):
    """One JSON record per key under ``directory``, each read and written under its stripe's lock.

    A record is written by :meth:`RecordFiles.write` (a whole file, then
    ``os.replace`` onto the record's name) under a ``flock`` that guards a
    stripe of keys, so a process killed mid-write leaves the old record or the
    new one, never half. A record that cannot be read, or whose fields have
    the wrong type or shape, raises :class:`CorruptRecordError` naming the
    file; it is never taken for a free one, and :meth:`purge` removes it.

    The directory must be this user's, and not writable by others unless
    sticky (see :func:`~uniqjob.stores._stripes.private_directory`); every
    file is opened with ``O_NOFOLLOW`` and must be a regular file of this
    user's, and files are made ``0o600``, whatever the umask.
    """

    name = "file"
    #: Whose records these are, in errors; what is wrong with one whose key was read ("" if nothing);
    #: whether the error for a record unreadable as far as its key names the key it was read for.
    _kind: ClassVar[str]
    _hint_key: ClassVar[bool]

    @staticmethod
    @abstractmethod
    def _problem(record: Record) -> str: ...

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
        self._stripes = Stripes(self.directory, timeout, self.name)
        self._files = RecordFiles(self._stripes, self._kind, self._problem, hint_key=self._hint_key)
        self._drops = DropLog(str(self.directory))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.directory)!r})"

    def _fence(self, stripe: int, now_us: int) -> int:
        """Issue a fence for a key of ``stripe``, whose lock is held (see :meth:`Stripes.fence`)."""
        try:
            return self._stripes.fence(stripe, now_us)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else f"the fence file of stripe {stripe}"
            raise BackendError(f"cannot issue a fence: {describe_error(where, exc)}", self.name) from exc

    @contextmanager
    def _held(self, key: str) -> Iterator[Held]:
        path, stripe = self._stripes.of(key)
        with self._stripes.locked(stripe):
            record = self._files.load(path, key)
            yield Held(
                record,
                self.clock(),
                functools.partial(self._files.write, path, stripe, existed=record is not None),
                functools.partial(self._fence, stripe),
                functools.partial(self._count, stripe),
            )

    def _count(self, stripe: int, cls: str, now: float, n: int, kind: str) -> None:
        self._drops.add(stripe, cls, now, n, kind)  # the stripe's lock is held

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield an error for each record file that cannot be read as far as its key."""
        yield from self._files.corrupt()

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record file, whatever it holds; return its path, or ``[]`` if there was none.

        ``key`` may also be the path of a record file in this directory, as a
        :class:`CorruptRecordError` names it, for a record that names no key.
        A symlink is removed, never followed. Fences are kept.
        """
        return self._files.purge(key)


class FileBackend(_FileRecords, LockMachineBackend):
    """Locks kept as files under ``directory``, safe across processes on one host.

    Records, writes and safety: as :class:`_FileRecords` says.

    Fences: each stripe keeps the last fence it issued in ``.NN.fence``, so a
    fence outlives its key's record (which goes with its last lock) without
    a file per key: a new one is greater than every fence of any key of the
    stripe, and so of its own. These files are never deleted.

    Dropped duplicates: each stripe appends those of its keys to ``.NN.drops``
    (see :mod:`uniqjob.stores._droplog`), under the stripe's lock, so in the
    same step as the refusal; :meth:`drops` sums them.
    """

    _kind = "lock"
    _problem = staticmethod(lock_problem)
    _hint_key = True

    def semaphores(self) -> SemaphoreStore:
        """A new semaphore store in this directory's ``concurrency/``, on this backend's timeout and clock."""
        clock = lambda: self.clock()  # noqa: E731, PLW0108 - a clock swapped in later is followed
        return FileSemaphores(self.directory / "concurrency", timeout=self.timeout, clock=clock)

    def drops(self, window: float = _drops.WINDOW) -> _drops.Tally:
        """Sum the counts of every stripe's ``.NN.drops`` (read unlocked: a line is one append)."""
        now = self.clock()
        first = _drops.first_minute(now, window)
        out: _drops.Tally = {name: {} for name in _drops.KINDS.values()}
        for stripe in range(STRIPES):
            _drops.tally(self._drops.read(self._drops.path(stripe), now), first, out)
        return out

    def scan(self) -> Iterator[str]:
        """Yield the key of every record, a record with bad fields too (:meth:`read` then raises).

        A record too damaged to name its key is yielded by :meth:`corrupt` instead.
        """
        for record in self._files.records():
            yield record["key"]


class FileSemaphores(_FileRecords, MachineStore):
    """Semaphores as JSON files under ``directory``, safe across processes on one host.

    Records, writes and safety: as :class:`_FileRecords` says, with the file
    backend's stripe locks (one ``flock`` per stripe, kept open).
    """

    _kind = "concurrency"
    _problem = staticmethod(semaphore_problem)
    _hint_key = False  # an unreadable record's error names no key: a purge by key (its hint) is for locks

    def scan(self) -> Iterator[str]:
        """Yield every key that holds a slot or a parked call, and every key whose record has bad fields.

        For the latter :meth:`read` raises :class:`CorruptRecordError`; a record
        too damaged to name its key is yielded by :meth:`corrupt` instead.
        """
        for record in self._files.records():
            if semaphore_problem(record) or record["slots"] or record.get("parked"):
                yield record["key"]


def from_url(url: str) -> FileBackend:
    """The FileBackend of a ``file:///dir`` URL, checked first (options: :data:`FILE_URL_OPTIONS`)."""
    try:
        parts = split(url)
        given = options(parts, FILE_URL_OPTIONS)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise Invalid("use file:///absolute/path/to/directory")
        path = unquote(parts.path)
        if "\x00" in path:
            raise Invalid("the path holds a NUL byte (%00)")
        if os.path.normpath(path).strip("/") == "":
            raise Invalid(
                "refusing / as a lock store (its .locks directory would go into the root directory); "
                "name a directory of its own, e.g. file:///var/lib/myapp/locks"
            )
        timeout = seconds("timeout", given["timeout"]) if "timeout" in given else None
    except Invalid as exc:
        raise bad("file", url, exc) from None
    return FileBackend(path) if timeout is None else FileBackend(path, timeout=timeout)
