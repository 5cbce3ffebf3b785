"""Semaphore stores for one host (files) and one process (memory), over the shared state machine."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from ..backends._stripes import Stripes
from ..errors import BackendError, CorruptRecordError
from ..locks import Holder
from ._machine import Machine, Record
from .base import HANDOFF, Outcome, Park, SemaphoreState, SemaphoreStore, encode_holder

__all__ = ["FileSemaphores", "MemorySemaphores"]

log = logging.getLogger(__name__)

_STRIPES = 64  # lock files guarding the records; bounded, never deleted


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


class FileSemaphores(MachineStore):
    """Semaphores as JSON files under ``directory``, safe across processes on one host.

    One record per key, written atomically (temporary file, then
    ``os.replace``) under a ``flock`` guarding a stripe of keys (the file
    backend's stripe lock, kept open); an unreadable record raises
    :class:`CorruptRecordError` naming the file. The temporary file is one per
    stripe (``.NN.tmp``), written only under its stripe's lock, so one that a
    crash left behind is simply written over by the next write.
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

    def __repr__(self) -> str:
        return f"FileSemaphores({str(self.directory)!r})"

    def close(self) -> None:
        """Close the stripes' lock files (they are opened again on next use)."""
        self._stripes.close()

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
        if not isinstance(record, dict) or not isinstance(record.get("key"), str) or "slots" not in record:
            raise CorruptRecordError(str(path), "not a uniqjob concurrency record")
        if key is not None and record["key"] != key:
            raise CorruptRecordError(str(path), f"holds key {record['key']!r}, expected {key!r}")
        return record

    def _store(self, path: Path, stripe: int, record: Record | None) -> None:
        if record is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{stripe:02d}.tmp")  # ours alone while we hold the stripe
        try:
            tmp.write_text(json.dumps(record, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @contextmanager
    def _machine(self, key: str, *, write: bool = True) -> Iterator[Machine]:
        where, stripe = self._stripes.of(key)
        path = Path(where)
        with self._stripes.locked(stripe):
            m = Machine(key, self._load(path, key), self.clock())
            yield m
            if write and m.changed:
                try:
                    self._store(path, stripe, m.record())
                except OSError as exc:
                    raise BackendError(f"cannot write {path}: {exc}", self.name) from exc

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
                    # under its stripe's lock: never a record half written over
                    with self._stripes.locked(Stripes.of_name(entry.name)):
                        record = self._load(Path(entry.path), None)
                except CorruptRecordError as exc:
                    log.warning("skipping %s", exc)
                    continue
                if record is not None and (record["slots"] or record["parked"]):
                    yield record["key"]
