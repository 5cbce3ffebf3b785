"""Stripe locks: a bounded set of lock files that guard the records of one directory.

Each key belongs to one of 64 stripes, by its digest. A stripe's lock is an
exclusive ``flock`` on ``<directory>/.locks/NN.lock`` (the lock ``filelock``
takes), held through a descriptor kept open: FileLock opens, checks and closes
its file on every acquire, which costs as much as the rest of a transition.
Both file stores (locks and concurrency semaphores) use these.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: FileLock picks the platform's own lock
    fcntl = None  # type: ignore[assignment]

from ..errors import BackendError

__all__ = ["STRIPES", "Stripes"]

STRIPES = 64  # lock files guarding the records; bounded, never deleted


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


class Stripes:
    """The stripe locks of one directory, for a store named ``owner`` (used in errors)."""

    def __init__(self, directory: Path, timeout: float, owner: str) -> None:
        self.directory = directory
        self.timeout = timeout
        self.owner = owner
        self._dir = str(directory)
        self._locks: dict[int, _Lock] = {}
        self._mutex = threading.Lock()
        try:
            (directory / ".locks").mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create lock directory {directory}: {exc}", owner) from exc

    def of(self, key: str) -> tuple[str, int]:
        """Return the path of ``key``'s record (``<digest>.json``) and its stripe."""
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        return os.path.join(self._dir, digest.hex() + ".json"), digest[0] % STRIPES

    @staticmethod
    def of_name(name: str) -> int:
        """Return the stripe of a record file named ``<digest>.json``."""
        return int(name[:2], 16) % STRIPES

    def _lock(self, n: int) -> _Lock:
        lock = self._locks.get(n)
        if lock is not None:
            return lock
        with self._mutex:
            lock = self._locks.get(n)
            if lock is None:
                path = os.path.join(self._dir, ".locks", f"{n:02d}.lock")
                if fcntl is None:  # pragma: no cover - not POSIX
                    lock = FileLock(path, timeout=self.timeout, preserve_lock_file=True)
                else:
                    lock = _StripeLock(path, self.timeout)
                self._locks[n] = lock
            return lock

    @contextmanager
    def locked(self, n: int) -> Iterator[None]:
        """Hold stripe ``n``; a timeout or an OS error is a :class:`BackendError` naming the file."""
        lock = self._lock(n)
        try:
            lock.acquire()
        except Timeout as exc:
            raise BackendError(
                f"timed out after {self.timeout}s waiting for {lock.lock_file}", self.owner
            ) from exc
        except OSError as exc:
            raise BackendError(f"cannot lock {lock.lock_file}: {exc}", self.owner) from exc
        try:
            yield
        finally:
            lock.release()

    def close(self) -> None:
        """Close the lock files (they are opened again on next use)."""
        with self._mutex:
            locks = list(self._locks.values())
        for lock in locks:
            if isinstance(lock, _StripeLock):
                lock.close()
