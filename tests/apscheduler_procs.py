"""A host of tests/test_apscheduler.py: an APScheduler BackgroundScheduler running one job every second.

``from tests.apscheduler_procs import main; main()``, configured by its environment: ``TICK_URL``
(the lock store), ``TICK_OUT`` (the file every host appends to), ``TICK_SLEEP``
(seconds each run lasts), ``TICK_LEASE`` (the run lease), ``TICK_UNTIL`` (the epoch
second at which the host stops; it lets a run in progress end first). Each host
fires on the same grid, half a second into each tick of the store's clock (the
test's Redis and files are on this host: its clock is the store's), as a cron
schedule does on hosts whose clocks agree.

Lines appended to ``TICK_OUT`` (each one ``write``, atomic under ``O_APPEND``):
``start PID TIME`` and ``end PID TIME`` around each run, and at exit
``calls PID CALLS RUNS`` (what APScheduler called on this host, and how many ran).
"""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

import uniqjob
from tests.integration_workers import pretend_other_host
from uniqjob.integrations.apscheduler import once_per_tick

#: The job's period, and the ticks', in seconds.
PERIOD = 1


def record(line: str) -> None:
    """Append one line to the shared file."""
    fd = os.open(os.environ["TICK_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@once_per_tick(PERIOD, run_lease=float(os.environ.get("TICK_LEASE", "10")))
def tick() -> bool:
    """The scheduled job: records its run."""
    record(f"start {os.getpid()} {time.time()}")
    time.sleep(float(os.environ.get("TICK_SLEEP", "0")))
    record(f"end {os.getpid()} {time.time()}")
    return True


def main() -> None:
    pretend_other_host()  # a dead host is known by its lapsed lease only, as on another machine
    uniqjob.configure(os.environ["TICK_URL"])
    results: list[object] = []

    def executed(event: JobExecutionEvent) -> None:
        results.append(event.retval)  # None: a duplicate, dropped

    scheduler = BackgroundScheduler()
    scheduler.add_listener(executed, EVENT_JOB_EXECUTED)
    first = datetime.fromtimestamp(math.floor(time.time()) + 1.5, UTC)  # mid-tick, every tick
    scheduler.add_job(tick, "interval", seconds=PERIOD, start_date=first)
    scheduler.start()
    time.sleep(max(0.0, float(os.environ["TICK_UNTIL"]) - time.time()))
    scheduler.shutdown(wait=True)
    record(f"calls {os.getpid()} {len(results)} {sum(1 for r in results if r)}")
