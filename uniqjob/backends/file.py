"""FileBackend: one JSON record per key in a directory, for one host."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: FileLock picks the platform's own lock
    fcntl = None  # type: ignore[assignment]

from ..errors import BackendError, CorruptRecordError
from ._records import Record, Slot, SlotBackend

__all__ = ["FileBackend"]

log = logging.getLogger(__name__)

_STRIPES = 64  # lock files guarding the records; bounded, never deleted


class _Lock(Protocol):
    lock_file: str

    def acquire(self) -> object: ...

    def release(self) -> object: ...


class _StripeLock:
    """One stripe's lock: ``flock`` on a lock file kept open, plus a mutex for this process's threads.

    A FileLock opens, checks and closes its file on every acquire: that costs
    as much as all the rest of a transition together. This keeps the file open
    instead; it is the same ``flock`` on the same files, so processes that use
    FileLock on them still exclude each other with this one.
    """

    _poll = (0.0005, 0.05)  # first and longest sleep between tries while another process holds it

    def __init__(self, path: str, timeout: float) -> None:
        self.lock_file = path
        self.timeout = timeout
        self._mutex = threading.Lock()
        self._fd = -1
        _stripe_locks.add(self)

    def _after_fork(self) -> None:
        # The child shares its parent's open file description, and flock() is held
        # per description: a child locking it would "succeed" while the parent holds it.
        self._drop()
        self._mutex = threading.Lock()  # another thread may have held it at fork

    def _drop(self, close: Callable[[int], None] = os.close) -> None:
        # ``close`` is bound here, and no contextlib.suppress: at interpreter exit
        # __del__ may run after this module's globals are gone.
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:  # noqa: SIM105
                close(fd)
            except OSError:
                pass

    def close(self) -> None:
        """Close the lock file (it is opened again on the next acquire)."""
        with self._mutex:
            self._drop()

    def __del__(self) -> None:
        self._drop()  # a raw descriptor is not closed by the collector

    def _open(self) -> int:
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except FileNotFoundError:  # the lock directory was removed under us: make it again, as FileLock does
            os.makedirs(os.path.dirname(self.lock_file), mode=0o700, exist_ok=True)
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._fd = fd
        return fd

    def acquire(self) -> None:
        """Hold the stripe, waiting up to ``timeout`` seconds; :class:`filelock.Timeout` after that."""
        forever = self.timeout < 0  # as with FileLock: a negative timeout waits for as long as it takes
        deadline = float("inf") if forever else time.monotonic() + self.timeout
        if not self._mutex.acquire(timeout=-1 if forever else self.timeout):
            raise Timeout(self.lock_file)
        try:
            self._lock(deadline)
        except BaseException:
            self._mutex.release()
            raise

    def _lock(self, deadline: float) -> None:
        assert fcntl is not None
        pause, longest = self._poll
        while True:
            fd = self._fd if self._fd >= 0 else self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Timeout(self.lock_file) from None
                time.sleep(pause)
                pause = min(pause * 2, longest)
                continue
            # Someone removed or replaced the lock file: a lock on the old inode guards nothing.
            if os.fstat(fd).st_nlink:
                return
            os.close(fd)
            self._fd = -1

    def release(self) -> None:
        """Let the stripe go."""
        try:
            assert fcntl is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()


_stripe_locks: weakref.WeakSet[_StripeLock] = weakref.WeakSet()


def _reset_stripe_locks() -> None:
    for lock in list(_stripe_locks):
        lock._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_stripe_locks)


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
        self._locks: dict[int, _Lock] = {}
        self._locks_mutex = threading.Lock()
        self._dir = str(self.directory)
        self._spare_paths: dict[int, list[str]] = {}
        try:
            (self.directory / ".locks").mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create lock directory {self.directory}: {exc}", self.name) from exc

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r})"

    def _path(self, key: str) -> tuple[str, int]:
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        return os.path.join(self._dir, digest.hex() + ".json"), digest[0] % _STRIPES

    def _stripe(self, n: int) -> _Lock:
        lock = self._locks.get(n)
        if lock is not None:
            return lock
        with self._locks_mutex:
            lock = self._locks.get(n)
            if lock is None:
                path = os.path.join(self._dir, ".locks", f"{n:02d}.lock")
                if fcntl is None:  # pragma: no cover - not POSIX
                    lock = FileLock(path, timeout=self.timeout, preserve_lock_file=True)
                else:
                    lock = _StripeLock(path, self.timeout)
                self._locks[n] = lock
            return lock

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
        path, stripe = self._path(key)
        with self._locked(stripe):
            record = self._load(path, key)
            slot = Slot(key, record, self.clock())
            yield slot
            if slot.changed:
                try:
                    self._store(path, stripe, slot.record(), record is not None)
                except OSError as exc:
                    raise BackendError(f"cannot write {path}: {exc}", self.name) from exc

    @contextmanager
    def _locked(self, stripe: int) -> Iterator[None]:
        lock = self._stripe(stripe)
        try:
            lock.acquire()
        except Timeout as exc:
            raise BackendError(
                f"timed out after {self.timeout}s waiting for {lock.lock_file}", self.name
            ) from exc
        except OSError as exc:
            raise BackendError(f"cannot lock {lock.lock_file}: {exc}", self.name) from exc
        try:
            yield
        finally:
            lock.release()

    def close(self) -> None:
        """Close the stripes' lock files."""
        with self._locks_mutex:
            locks = list(self._locks.values())
        for lock in locks:
            if isinstance(lock, _StripeLock):
                lock.close()

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
                    with self._locked(int(name[:2], 16) % _STRIPES):
                        record = self._load(entry.path, None)
                    if record is not None and self._path(record["key"])[0] != entry.path:
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
