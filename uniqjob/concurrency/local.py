"""Semaphore stores for one host (files) and one process (memory), over the shared state machine."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from ..errors import CorruptRecordError
from ..locks import Holder
from ..stores._files import RecordFiles, write_all
from ..stores._stripes import FILE_MODE, OPEN_FLAGS, Stripes
from ._machine import Machine, Record, record_problem
from .base import HANDOFF, Outcome, Park, SemaphoreState, SemaphoreStore, encode_holder

__all__ = ["FileSemaphores", "MemorySemaphores"]

log = logging.getLogger(__name__)


class MachineStore(SemaphoreStore):
    """A store that keeps each key as one record and runs :class:`Machine` transitions on it."""

    def acquire(
        self,
        key: str,
        token: str,
        *,
        limit: int,
        lease: float,
        running: bool,
        holder: Holder | None,
        park: Park | None,
        job_class: str,
        args: str,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.acquire(
                token,
                limit=limit,
                lease=lease,
                running=running,
                holder=encode_holder(holder),
                park=park,
                job_class=job_class,
                args=args,
                caller=encode_holder(caller),
                handoff=handoff,
            )

    def start(
        self,
        key: str,
        token: str,
        *,
        holder: Holder,
        lease: float,
        takeover: Holder | None,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.start(
                token,
                holder=encode_holder(holder),
                lease=lease,
                takeover=encode_holder(takeover),
                caller=encode_holder(caller),
                handoff=handoff,
            )

    def renew(
        self, key: str, token: str, lease: float, *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        with self._machine(key) as m:
            return m.renew(token, lease, encode_holder(caller), handoff)

    def release(self, key: str, token: str, *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        with self._machine(key) as m:
            return m.release(token, encode_holder(caller), handoff)

    def requeue(
        self,
        key: str,
        token: str,
        lease: float,
        *,
        holder: Holder,
        caller: Holder,
        handoff: float = HANDOFF,
    ) -> Outcome:
        with self._machine(key) as m:
            return m.requeue(token, lease, encode_holder(holder), encode_holder(caller), handoff)

    def handed(self, key: str, token: str, promoter: Holder) -> bool:
        with self._machine(key) as m:
            return m.handed(token, encode_holder(promoter))

    def withdraw(self, key: str, token: str) -> Outcome:
        with self._machine(key) as m:
            return m.withdraw(token)

    def reap(
        self, key: str, dead: Sequence[tuple[str, Holder]], *, caller: Holder, handoff: float = HANDOFF
    ) -> Outcome:
        with self._machine(key) as m:
            return m.reap([(t, encode_holder(h)) for t, h in dead], encode_holder(caller), handoff)

    def discard_parked(self, key: str) -> list[tuple[str, str]]:
        with self._machine(key) as m:
            return m.discard_parked()

    def drop(self, key: str, tokens: Sequence[str], *, caller: Holder, handoff: float = HANDOFF) -> Outcome:
        with self._machine(key) as m:
            return m.drop(tokens, encode_holder(caller), handoff)

    def read(self, key: str, *, head: int = 5) -> SemaphoreState:
        with self._machine(key, write=False) as m:
            return m.state(head)

    @abstractmethod
    def _machine(self, key: str, *, write: bool = True) -> AbstractContextManager[Machine]:
        """Hold the key's mutual exclusion, yield its machine, store the record if it changed."""


class MemorySemaphores(MachineStore):
    """Semaphores in a dict, for one process; ``clock`` is injectable so tests never sleep."""

    name = "memory"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._records: dict[str, Record] = {}
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"MemorySemaphores(<{len(self._records)} keys>)"

    @contextmanager
    def _machine(self, key: str, *, write: bool = True) -> Iterator[Machine]:
        with self._mutex:
            # A deep copy, so a transition that raises half-way leaves the stored record untouched.
            stored = self._records.get(key)
            m = Machine(key, json.loads(json.dumps(stored)) if stored else None, self.clock())
            yield m
            if write and m.changed:
                record = m.record()
                if record is None:
                    self._records.pop(key, None)
                else:
                    self._records[key] = record

    def scan(self) -> Iterator[str]:
        with self._mutex:
            keys = [k for k, r in self._records.items() if r["slots"] or r["parked"]]
        yield from keys

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record whatever it holds; return ``[key]`` if there was one, else ``[]``."""
        with self._mutex:
            return [key] if self._records.pop(key, None) is not None else []


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
        self._files = RecordFiles(self._stripes, "concurrency", record_problem, hint_key=False)

    def __repr__(self) -> str:
        return f"FileSemaphores({str(self.directory)!r})"

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

    def _store(self, path: str, stripe: int, record: Record | None) -> None:
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
            if record_problem(record) or record["slots"] or record.get("parked"):
                yield record["key"]

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield an error for each record file that cannot be read as far as its key."""
        yield from self._files.corrupt()

    def purge(self, key: str) -> list[str]:
        """Remove ``key``'s record file whatever it holds (or the record file at the path ``key``); return it.

        A symlink is removed, never followed; ``[]`` when there was nothing.
        """
        return self._files.purge(key)
