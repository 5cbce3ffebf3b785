"""Jobs and process entry points for the multi-process tests (importable by spawned children)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import uniqjob
from uniqjob import UniqueJob
from uniqjob import locks as locks_module


class Counted(UniqueJob):
    """Records how many performs of a key run at once, through shared counters."""

    unique_run_lease = 5.0
    shared: Any = None  # (active, max_active) multiprocessing Values, set in the child

    def perform(self, n: int) -> float:
        active, max_active = self.shared
        with active.get_lock():
            active.value += 1
            max_active.value = max(max_active.value, active.value)
        began = time.monotonic()
        time.sleep(random.uniform(0, 0.003))
        with active.get_lock():
            active.value -= 1
        return began


def race_worker(url: str, attempts: int, shared: Any, results: Any) -> None:
    """Enqueue key 1 ``attempts`` times; report (asked, answered, run_start, run_end) per attempt."""
    uniqjob.configure(url)
    Counted.shared = shared
    log = []
    for _ in range(attempts):
        asked = time.monotonic()
        began = Counted.enqueue(1)
        answered = time.monotonic()
        log.append((asked, answered, began))
    results.put(log)


class Sleeper(UniqueJob):
    """Signals that it started, then runs until killed."""

    unique_run_lease = 30.0

    def perform(self, n: int) -> None:
        with open(os.environ["UNIQJOB_TEST_STARTED"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)


def crash_worker(url: str, started_file: str, lease: float, host: str | None) -> None:
    """Run Sleeper(1) as host ``host`` (None: this host) with run lease ``lease``; killed by the test."""
    os.environ["UNIQJOB_TEST_STARTED"] = started_file
    uniqjob.configure(url)
    Sleeper.unique_run_lease = lease
    if host is not None:  # pretend to be another machine: a pid space we cannot inspect
        me = locks_module.local_holder()
        locks_module._local = locks_module.Holder(host, "node-of-" + host, me.pid, me.pstart)
    Sleeper.enqueue(1)
