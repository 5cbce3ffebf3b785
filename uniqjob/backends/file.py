"""FileBackend: one JSON record per key in a directory, for one host."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import BackendError, CorruptRecordError
from ._records import Record, Slot, SlotBackend

__all__ = ["FileBackend"]

log = logging.getLogger(__name__)

_STRIPES = 64  # lock files guarding the records; bounded, never deleted


class FileBackend(SlotBackend):
    """Locks kept as files under ``directory``, safe across processes on one host.

    Each key's record is written atomically (temporary file, then
    ``os.replace``) under a ``filelock`` that guards a stripe of keys, so a
    process killed mid-write leaves the old record or the new one, never half.
    A record that cannot be read raises :class:`CorruptRecordError` naming the
    file; it is never taken for a free lock.
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
        self._locks: dict[int, FileLock] = {}
        self._locks_mutex = threading.Lock()
        try:
            (self.directory / ".locks").mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create lock directory {self.directory}: {exc}", self.name) from exc

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r})"

    def _path(self, key: str) -> tuple[Path, int]:
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        return self.directory / f"{digest.hex()}.json", digest[0] % _STRIPES

    def _stripe(self, n: int) -> FileLock:
        with self._locks_mutex:
            lock = self._locks.get(n)
            if lock is None:
                path = self.directory / ".locks" / f"{n:02d}.lock"
                lock = self._locks[n] = FileLock(path, timeout=self.timeout, preserve_lock_file=True)
            return lock

    def _load(self, path: Path, key: str | None) -> Record | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptRecordError(str(path), str(exc)) from exc
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise CorruptRecordError(str(path), f"not valid JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise CorruptRecordError(str(path), "not a uniqjob lock record")
        if key is not None and record["key"] != key:
            raise CorruptRecordError(str(path), f"holds key {record['key']!r}, expected {key!r}")
        return record

    def _store(self, path: Path, record: Record | None) -> None:
        if record is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(record, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @contextmanager
    def _slot(self, key: str) -> Iterator[Slot]:
        path, stripe = self._path(key)
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
            slot = Slot(key, self._load(path, key), self.clock())
            yield slot
            if slot.changed:
                try:
                    self._store(path, slot.record())
                except OSError as exc:
                    raise BackendError(f"cannot write {path}: {exc}", self.name) from exc
        finally:
            lock.release()

    def scan(self) -> Iterator[str]:
        try:
            entries = os.scandir(self.directory)
        except OSError as exc:
            raise BackendError(f"cannot list {self.directory}: {exc}", self.name) from exc
        with entries:
            for entry in entries:
                if not entry.name.endswith(".json") or entry.name.startswith("."):
                    continue
                try:
                    record = self._load(Path(entry.path), None)
                except CorruptRecordError as exc:
                    log.warning("skipping %s", exc)
                    continue
                if record is not None:
                    yield record["key"]
