"""The soak test's worker processes and its protected resource (see tests/test_soak.py).

A worker loops over a few keys, calling ``SoakJob.run(key)``. Each perform
takes a handful of small steps; before each it checks ``current_lock().lost``
and stops if the lock is (presumed) lost; each step writes to the
:class:`FencedResource` with the lock's fence. Every event goes, one JSON line
each, to the worker's own log, written with one ``write()`` so that a SIGKILL
loses nothing already logged.

Times are ``time.monotonic()``: on Linux CLOCK_MONOTONIC is one clock for every
process of the machine, and a wall clock step cannot reorder events.

A worker is started as ``main([URL, DIRECTORY, KEYS, LEASE])``: it logs to
``DIRECTORY/logs``, writes to the resource in ``DIRECTORY/resources``, and
exits after its current perform once ``DIRECTORY/stop`` exists.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import uniqjob
from uniqjob import BackendError, UniqueJob

#: Seconds one step of a perform works before it writes.
STEP = 0.1
#: A perform takes this many steps, drawn at random: from well under a lease to more than one.
STEPS = (5, 40)


class FencedResource:
    """What the locks protect: one SQLite file per key that refuses writes with an older fence.

    A write is accepted when its fence is at least the highest fence accepted
    for the key (equal: the same holder writing again), like the README's
    ``UPDATE ... WHERE fence <= :f``; every write, accepted or refused, is
    logged in commit order. One file per key, so a holder frozen inside a
    write holds up only its own key's resource.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._connections: dict[int, sqlite3.Connection] = {}

    def path(self, key: int) -> Path:
        return self.directory / f"resource-{key}.sqlite"

    def _connection(self, key: int) -> sqlite3.Connection:
        con = self._connections.get(key)
        if con is None:
            con = sqlite3.connect(self.path(key), timeout=60.0, isolation_level=None)
            con.execute("PRAGMA synchronous = OFF")  # a killed process loses nothing; only a crash would
            self._connections[key] = con
        return con

    def create(self, key: int) -> None:
        """Create the key's resource, empty (last fence 0)."""
        con = self._connection(key)
        con.executescript(
            """
            CREATE TABLE last (id INTEGER PRIMARY KEY CHECK (id = 0), fence INTEGER NOT NULL);
            INSERT INTO last VALUES (0, 0);
            CREATE TABLE writes (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL, perform TEXT NOT NULL,
                pid INTEGER NOT NULL, t REAL NOT NULL, accepted INTEGER NOT NULL
            );
            """
        )

    def write(self, key: int, fence: int, perform: str) -> bool:
        """Write one step of ``perform`` with ``fence``; False if a newer fence was accepted before."""
        con = self._connection(key)
        con.execute("BEGIN IMMEDIATE")
        try:
            accepted = con.execute("UPDATE last SET fence = ? WHERE fence <= ?", (fence, fence)).rowcount == 1
            con.execute(
                "INSERT INTO writes (fence, perform, pid, t, accepted) VALUES (?, ?, ?, ?, ?)",
                (fence, perform, os.getpid(), time.monotonic(), int(accepted)),
            )
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return accepted

    def writes(self, key: int) -> list[tuple[int, int, str, int, float, bool]]:
        """Every write to the key, in commit order: (seq, fence, perform, pid, time, accepted)."""
        rows = self._connection(key).execute(
            "SELECT seq, fence, perform, pid, t, accepted FROM writes ORDER BY seq"
        )
        return [(seq, fence, perform, pid, t, bool(ok)) for seq, fence, perform, pid, t, ok in rows]

    def close(self) -> None:
        for con in self._connections.values():
            con.close()
        self._connections.clear()


class EventLog:
    """One worker's events, a JSON line each, appended with a single write()."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "pid": os.getpid(), "t": time.monotonic(), **fields})
        os.write(self._fd, line.encode() + b"\n")


class SoakJob(UniqueJob):
    """One perform of a key: steps that each work a little, then write with the lock's fence.

    Before each step the perform checks ``lock.lost`` and stops if the lock is
    (presumed) lost, as the README asks. A holder frozen during a step's work
    writes when it wakes, before its next check: the late write that the
    fence must get refused.
    """

    unique_run_lease = 3.0
    resource: FencedResource | None = None  # set by the worker
    log: EventLog | None = None
    performs = 0

    def perform(self, key: int) -> str:
        resource, log = self.resource, self.log
        assert resource is not None and log is not None
        lock = uniqjob.current_lock()
        assert lock is not None, "current_lock() is None inside perform"
        SoakJob.performs += 1
        perform = f"{os.getpid()}-{SoakJob.performs}"
        log("start", key=key, perform=perform, fence=lock.fence)
        steps, written, refused, lost_at = random.randint(*STEPS), 0, 0, None
        for _ in range(steps):
            if lock.lost:
                lost_at = time.monotonic()
                break
            time.sleep(STEP)  # the step's work
            fence = lock.fence
            assert fence is not None, "lock.fence is None while the run lock is held"
            if not resource.write(key, fence, perform):
                refused += 1
                break  # a newer holder has written: this one stops, as a real job would
            written += 1
        log("end", key=key, perform=perform, steps=steps, written=written, refused=refused, lost_at=lost_at)
        return perform


def work(url: str, directory: Path, keys: int, lease: float) -> None:
    """Call ``SoakJob.run(key)`` over random keys until ``directory/stop`` exists or the parent dies."""
    parent, stop_file = os.getppid(), directory / "stop"
    log = EventLog(directory / "logs" / f"events-{os.getpid()}.jsonl")
    SoakJob.unique_backend = url
    SoakJob.unique_run_lease = lease
    SoakJob.resource = FencedResource(directory / "resources")
    SoakJob.log = log
    log("worker")
    while not stop_file.exists() and os.getppid() == parent:
        key = random.randrange(keys)
        try:
            if SoakJob.run(key) is None:
                log("busy", key=key)
        except BackendError as exc:  # the store is away: expected under faults, counted
            log("error", key=key, kind="BackendError", msg=str(exc)[:300])
        except Exception as exc:  # anything else reaching the caller is a bug: logged, counted, fatal later
            log("error", key=key, kind=type(exc).__name__, msg=repr(exc)[:300])
        time.sleep(random.uniform(0.0, 0.05))
    log("exit")


def main(argv: list[str]) -> None:
    url, directory, keys, lease = argv
    # The library's warnings (heartbeat failures, undos, losses) go to this process's stderr file.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s: %(message)s")
    work(url, Path(directory), int(keys), float(lease))
