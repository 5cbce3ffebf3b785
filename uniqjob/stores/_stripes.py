"""Stripe locks: a bounded set of lock files that guard the records of one directory.

Each key belongs to one of 64 stripes, by its digest. A stripe's lock is an
exclusive ``flock`` on ``<directory>/.locks/NN.lock`` (the lock ``filelock``
takes), held through a descriptor kept open: FileLock opens, checks and closes
its file on every acquire, which costs as much as the rest of a transition.
Both file stores (locks and concurrency semaphores) use these, and the
helpers below that keep a store directory private: every store file is opened
with ``O_NOFOLLOW`` and must be a regular file of this user's, directories are
made ``0o700`` and files ``0o600`` whatever the umask, and a directory that
another user owns or may write to is refused (its owner could plant a symlink
where a store file goes, and redirect this user's writes). A directory shared
by several Unix users is therefore not supported.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

# filelock is imported only off POSIX (where its FileLock picks the platform's own lock):
# on POSIX the stripes flock() their files themselves, and filelock is a heavy import.
try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

from ..errors import BackendError, ConfigurationError
from ._log import get_logger

if TYPE_CHECKING:  # a name for the type checker only: a Protocol class is slow to make

    class _Lock(Protocol):
        lock_file: str

        def acquire(self) -> object: ...

        def release(self) -> object: ...


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "OPEN_FLAGS",
    "STRIPES",
    "Stripes",
    "describe_error",
    "file_problem",
    "os_reason",
    "private_directory",
]

log = get_logger(__name__)

STRIPES = 64  # lock files guarding the records; bounded, never deleted
DIR_MODE = 0o700  # a store's directories: this user's alone
FILE_MODE = 0o600  # and its files
#: Every store file is opened with these: never through a symlink, never inherited by a child.
OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def os_reason(exc: OSError) -> str:
    """Say what went wrong with a store file, and for a symlink what to do about it."""
    if exc.errno == errno.ELOOP:
        return (
            "a symbolic link, which no store file ever is (someone may have planted it to redirect "
            "this store's writes): it was not followed; remove it"
        )
    return exc.strerror or str(exc)


def describe_error(path: str, exc: OSError) -> str:
    """``path: reason`` for an OS error on a store file (see :func:`os_reason`)."""
    return f"{path}: {os_reason(exc)}"


def file_problem(info: os.stat_result) -> str:
    """Return why a store file, as ``fstat`` saw it, must not be used; "" if it may."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    euid = _euid()
    if euid is not None and info.st_uid != euid:
        return f"owned by uid {info.st_uid}, not by this user (uid {euid})"
    return ""


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def private_directory(directory: Path, owner: str) -> bool:
    """Make ``directory`` and its ``.locks`` (``0o700``) if missing, then refuse either if it is unsafe.

    Unsafe: owned by another user (root included), or writable by others
    without the sticky bit. An OS error is a :class:`BackendError`; an unsafe
    directory a :class:`ConfigurationError` that names it and the fix.
    Returns whether other users may create files in ``directory`` (it is sticky):
    then only this user's files there are the store's.
    """
    locks = directory / ".locks"
    try:
        _make_directories(directory)
        top = os.stat(directory)
    except OSError as exc:
        raise BackendError(f"cannot create lock directory {directory}: {exc}", owner) from exc
    _refuse_unsafe(directory, top, owner)  # before making anything in it
    try:
        _make_directories(locks)
        info = os.lstat(locks)
    except OSError as exc:
        raise BackendError(f"cannot create lock directory {locks}: {exc}", owner) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(
            f"{locks} is not a directory (a symbolic link?): it must be this store's own; remove it"
        )
    _refuse_unsafe(locks, info, owner)
    return bool(top.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _make_directories(path: Path) -> None:
    """Make ``path`` and its missing parents, each with mode ``0o700`` whatever the umask."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(made):  # a file in the way: say so
                raise
            continue  # another process made it meanwhile
        os.chmod(made, DIR_MODE)  # the umask may have taken bits from the mode given to mkdir


def _refuse_unsafe(path: Path, info: os.stat_result, owner: str) -> None:
    euid = _euid()
    if euid is None:  # pragma: no cover - not POSIX: no owners to compare
        return
    if info.st_uid != euid:
        raise ConfigurationError(
            f"{owner} store directory {path} is owned by uid {info.st_uid}, not by this user (uid {euid}): "
            "its owner could plant files there that redirect this store's writes; "
            f"use a directory of your own (or chown it to uid {euid})"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        raise ConfigurationError(
            f"{owner} store directory {path} is writable by other users (mode {mode:o}) without the "
            "sticky bit: they could plant files there that redirect this store's writes; "
            f"run: chmod go-w {path}"
        )


def open_fence_file(path: str) -> int:
    """Open (or make, ``0o600``) the fence file at ``path``: a regular file of this user's, not a symlink."""
    return _own_file(os.open(path, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, FILE_MODE), path, "fence file")


def _own_file(fd: int, path: str, what: str) -> int:
    """Return ``fd``, the ``what`` just opened at ``path``, made ``0o600`` if it was not.

    If it is no regular file of this user's, close it and raise a :class:`BackendError` naming it.
    """
    try:
        info = os.fstat(fd)
        problem = file_problem(info)
        if problem:
            raise BackendError(f"{what} {path} is {problem}: remove it", "file")
        if stat.S_IMODE(info.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)  # made under a umask that took bits, or by an older version
    except BaseException:
        os.close(fd)
        raise
    return fd


def issue_fence(fd: int, now_us: int, path: str) -> int:
    """Issue a fence from the fence file open at ``fd``, under its stripe's lock, and keep it there.

    The fence is ``now_us`` (the store clock in microseconds), or the last one
    the file holds plus one if that is more: greater than every fence issued
    for any key of the stripe, so for each key too. The file is written before
    the record that carries the fence: a fence is never handed out unkept. It
    is never deleted, so fences survive their records (which go with their
    last lock) without a file per key.
    """
    fence = max(now_us, _last_fence(fd, path) + 1)
    os.pwrite(fd, b"%020d\n" % fence, 0)  # always 21 bytes: written over in place
    return fence


def _last_fence(fd: int, path: str) -> int:
    """The fence the fence file open at ``fd`` holds; 0 for a new one, or one damaged (logged)."""
    raw = os.pread(fd, 32, 0)
    text = raw.strip()
    if text.isdigit():
        return int(text)
    if text:
        # Fail soft: fences still follow the clock, and only a clock stepping back could repeat one.
        log.warning("fence file %s holds %r, not a fence: writing it over", path, raw)
    return 0


class StripeTimeout(TimeoutError):
    """A stripe's lock was not taken within its timeout (on POSIX; off POSIX, :class:`filelock.Timeout`)."""

    def __init__(self, lock_file: str) -> None:
        super().__init__(f"The file lock '{lock_file}' could not be acquired.")
        self.lock_file = lock_file


def _is_timeout(exc: OSError) -> bool:
    """Whether ``exc`` is a stripe lock's timeout: ours, or filelock's (off POSIX, once it is loaded)."""
    if isinstance(exc, StripeTimeout):
        return True
    filelock = sys.modules.get("filelock")
    return filelock is not None and isinstance(exc, filelock.Timeout)


class _StripeLock:
    """One stripe's lock: ``flock`` on a lock file kept open, plus a mutex for this process's threads.

    A FileLock opens, checks and closes its file on every acquire: that costs
    as much as all the rest of a transition together. This keeps the file open
    instead; it is the same ``flock`` on the same files, so processes that use
    FileLock on them still exclude each other with this one.
    """

    _poll = (0.0005, 0.05)  # first and longest sleep between tries while another process holds it

    def __init__(self, path: str, timeout: float, fence_file: str) -> None:
        self.lock_file = path
        self.fence_file = fence_file
        self.timeout = timeout
        self._mutex = threading.Lock()
        self._fd = -1
        self._fence_fd = -1  # kept open too, once the stripe issued a fence: see fence()
        _stripe_locks.add(self)

    def _after_fork(self) -> None:
        # The child shares its parent's open file description, and flock() is held
        # per description: a child locking it would "succeed" while the parent holds it.
        self._drop()
        self._mutex = threading.Lock()  # another thread may have held it at fork

    def _drop(self, close: Callable[[int], None] = os.close) -> None:
        # ``close`` is bound here, and no contextlib.suppress: at interpreter exit
        # __del__ may run after this module's globals are gone.
        fds = (self._fd, self._fence_fd)
        self._fd = self._fence_fd = -1
        for fd in fds:
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
        flags = os.O_RDWR | os.O_CREAT | OPEN_FLAGS
        try:
            fd = os.open(self.lock_file, flags, FILE_MODE)
        except FileNotFoundError:  # the lock directory was removed under us: make it again, as FileLock does
            _make_directories(Path(self.lock_file).parent)
            fd = os.open(self.lock_file, flags, FILE_MODE)
        self._fd = _own_file(fd, self.lock_file, "lock file")
        return self._fd

    def acquire(self) -> None:
        """Hold the stripe, waiting up to ``timeout`` seconds; :class:`StripeTimeout` after that."""
        forever = self.timeout < 0  # as with FileLock: a negative timeout waits for as long as it takes
        deadline = float("inf") if forever else time.monotonic() + self.timeout
        if not self._mutex.acquire(timeout=-1 if forever else self.timeout):
            raise StripeTimeout(self.lock_file)
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
                    raise StripeTimeout(self.lock_file) from None
                time.sleep(pause)
                pause = min(pause * 2, longest)
                continue
            # Someone removed or replaced the lock file: a lock on the old inode guards nothing.
            if os.fstat(fd).st_nlink:
                return
            os.close(fd)
            self._fd = -1

    def fence(self, now_us: int) -> int:
        """Issue the stripe's next fence (see :func:`issue_fence`); only while the stripe is held.

        The fence file stays open, as the lock file does: opening it for each
        grant cost a tenth of a lock cycle. One that was removed meanwhile is
        made again, holding the last fence the removed one held: this process
        never keeps a fence where no other process can read it.
        """
        fd = self._fence_fd
        if fd >= 0 and not os.fstat(fd).st_nlink:
            now_us = max(now_us, _last_fence(fd, self.fence_file) + 1)  # what the removed file held
            self._fence_fd = -1
            os.close(fd)
            fd = -1
        if fd < 0:
            fd = self._fence_fd = open_fence_file(self.fence_file)
        return issue_fence(fd, now_us, self.fence_file)

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
        #: Whether other users may create files in the directory (sticky): see :func:`private_directory`.
        self.shared = private_directory(directory, owner)

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
                    from filelock import FileLock

                    lock = FileLock(path, timeout=self.timeout, preserve_lock_file=True)
                else:
                    lock = _StripeLock(path, self.timeout, self._fence_file(n))
                self._locks[n] = lock
            return lock

    def _fence_file(self, n: int) -> str:
        return os.path.join(self._dir, f".{n:02d}.fence")

    def fence(self, n: int, now_us: int) -> int:
        """Issue a fence for a key of stripe ``n``, which the caller holds (see :func:`issue_fence`).

        An OS error is raised as it is; a fence file that is no regular file of
        this user's is a :class:`BackendError`.
        """
        lock = self._lock(n)
        if isinstance(lock, _StripeLock):
            return lock.fence(now_us)
        fd = open_fence_file(self._fence_file(n))  # pragma: no cover - not POSIX
        try:  # pragma: no cover
            return issue_fence(fd, now_us, self._fence_file(n))
        finally:  # pragma: no cover
            os.close(fd)

    @contextmanager
    def locked(self, n: int) -> Iterator[None]:
        """Hold stripe ``n``; a timeout or an OS error is a :class:`BackendError` naming the file."""
        lock = self._lock(n)
        try:
            lock.acquire()
        except OSError as exc:  # filelock's Timeout, and ours, are OSErrors too
            if _is_timeout(exc):
                raise BackendError(
                    f"timed out after {self.timeout}s waiting for {lock.lock_file}", self.owner
                ) from exc
            raise BackendError(f"cannot lock: {describe_error(lock.lock_file, exc)}", self.owner) from exc
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
