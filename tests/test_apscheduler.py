"""APScheduler: a schedule started on several hosts runs once per tick across them (once_per_tick).

In this process, on an injected clock: the tick's rule, a long run holding off
the next ticks, the round trips of a refused tick on a real redis-server, a real
BackgroundScheduler. As real processes (slow): three schedulers on one Redis
and on one file store, each tick run once; a long run never overlapped; a
SIGKILLed host's lock reclaimed and a later tick run by another.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from apscheduler.events import EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.util import iscoroutinefunction_partial, obj_to_ref, ref_to_obj

import uniqjob
from tests.conftest import FakeClock
from tests.integration_workers import NODE_VAR, REPO
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, MemoryBackend
from uniqjob.integrations import apscheduler as aps
from uniqjob.integrations.apscheduler import once_per_tick

BOUNDARY = 60.0 * 30_000_000  # a minute's boundary of the injected clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The memory store's clock, read at every call (no monotonic carrying forward: it is injected)."""
    monkeypatch.setattr(aps, "CLOCK_REFRESH", 0.0)
    clock = FakeClock(BOUNDARY + 1)
    uniqjob.configure(MemoryBackend(clock=clock))
    return clock


def test_a_tick_runs_once_on_any_number_of_calls_and_the_next_tick_runs_again(clock: FakeClock) -> None:
    runs: list[str] = []

    @once_per_tick("1m")
    def sync(region: str) -> str:
        runs.append(region)
        return region

    assert sync("eu") == "eu"
    assert sync("eu") is None and sync("eu") is None  # other hosts firing in the same tick: dropped
    assert sync("us") == "us"  # another job's arguments: another key
    clock.advance(52)  # 53s into the minute: still its tick (the next starts a skew, 6s, early)
    assert sync("eu") is None
    clock.advance(2)  # 55s: a host ahead of the store by up to the skew counts into the next tick
    assert sync("eu") == "eu"
    clock.advance(30)
    assert sync("eu") is None
    assert runs == ["eu", "us", "eu"]
    backend = sync.unique_job.backend()
    assert backend.duplicates()[sync.unique_job.job_name()] == 4  # each dropped call counted


def test_a_run_holds_off_the_next_ticks_until_it_ends(clock: FakeClock) -> None:
    started, finish = threading.Event(), threading.Event()

    @once_per_tick(10, run_lease=30)
    def export() -> str:
        started.set()
        finish.wait(10)
        return "exported"

    first = threading.Thread(target=export)
    first.start()
    try:
        assert started.wait(10)
        for _ in range(3):  # its tick, and the two after it: the run lock refuses them
            assert export() is None
            clock.advance(10)
    finally:
        finish.set()
        first.join()
    assert export() == "exported"  # the first run over, this tick runs
    assert export.unique_job.backend().duplicates()[export.unique_job.job_name()] == 3


def test_an_async_job_is_awaited_under_the_tick_s_lock(clock: FakeClock) -> None:
    @once_per_tick("1m")
    async def refresh() -> str:
        return "refreshed"

    assert iscoroutinefunction_partial(refresh)  # AsyncIOScheduler awaits it
    assert asyncio.run(refresh()) == "refreshed"
    assert asyncio.run(refresh()) is None


def test_a_persistent_job_store_finds_the_function_by_its_name() -> None:
    from tests.apscheduler_procs import tick

    assert obj_to_ref(tick) == "tests.apscheduler_procs:tick" and ref_to_obj(obj_to_ref(tick)) is tick


@pytest.mark.parametrize(
    ("every", "options", "message"),
    [
        (
            "1m",
            {"on_conflit": "raise"},
            "once_per_tick has no option 'on_conflit' (did you mean 'on_conflict'?",
        ),
        ("1m", {"strategy": "until_executed"}, "once_per_tick sets strategy itself"),
        ("1m", {"once_per": "1m"}, "once_per_tick sets once_per itself"),
        ("1m", {"lock_autoexpire": 60}, "once_per_tick sets lock_autoexpire itself"),
        ("1m", {"on_conflict": "reschedule"}, "on_conflict 'reschedule' would run them later"),
        ("1m", {"run_lease": 0.1}, "run_lease must be 1 to 86400 seconds"),
        ("daily", {}, "once_per_tick(every): bad period 'daily'"),
        (0.5, {}, "once_per_tick(every): a tick must be at least 1s, got 0.5"),
    ],
)
def test_misconfiguration_is_an_error_naming_it(
    every: object, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        once_per_tick(every, **options)(len)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_a_refused_tick_is_one_round_trip_to_redis(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    uniqjob.configure(redis_server.url)

    @once_per_tick("1d")
    def nightly(day: int) -> int:
        return day

    def trips(calls: int, day: int) -> float:
        before = int(redis_client.info("stats")["total_reads_processed"])
        for _ in range(calls):
            nightly(day)
        return (int(redis_client.info("stats")["total_reads_processed"]) - before - 1) / calls  # less INFO

    assert nightly(0) == 0  # the store's clock read (once a minute), the scripts loaded
    assert trips(1, 1) == 3  # a fresh tick: the queue lock, the run lock, the release
    assert trips(10, 1) == 1  # a tick another host already ran: one claim, refused


def test_a_real_scheduler_s_jobs_of_one_function_run_once_per_tick() -> None:
    """Two jobs of one function in one BackgroundScheduler: two hosts' schedules, on the memory store."""
    uniqjob.configure(MemoryBackend())
    runs: list[float] = []
    results: list[object] = []

    @once_per_tick(1)
    def beat() -> bool:
        runs.append(time.time())
        return True

    def executed(event: JobExecutionEvent) -> None:
        results.append(event.retval)

    scheduler = BackgroundScheduler()
    scheduler.add_listener(executed, EVENT_JOB_EXECUTED)
    first = datetime.fromtimestamp(math.floor(time.time()) + 1.5, UTC)  # mid-tick
    scheduler.add_job(beat, "interval", seconds=1, start_date=first, id="host-a")
    scheduler.add_job(beat, "interval", seconds=1, start_date=first, id="host-b")
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while len(results) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        scheduler.shutdown(wait=True)
    ticks = [math.floor(t + 0.1) for t in runs]
    assert len(results) >= 4 and len(ticks) == len(set(ticks)) == sum(1 for r in results if r)
    assert results.count(None) >= len(results) - len(ticks) >= 2


# -- three schedulers, as processes ------------------------------------------------------------


@pytest.fixture(params=["redis", "file"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "locks").as_uri()
    request.getfixturevalue("redis_client")  # flushes the database
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


class Hosts:
    """Three scheduler processes (tests/apscheduler_procs.py) on one store, and what they recorded."""

    def __init__(self, url: str, out: Path, *, until: float, sleep: float = 0.0, lease: float = 10.0) -> None:
        self.out = out
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {
            **os.environ,
            "PYTHONPATH": path,
            "TICK_URL": url,
            "TICK_OUT": str(out),
            "TICK_SLEEP": str(sleep),
            "TICK_LEASE": str(lease),
            "TICK_UNTIL": str(time.time() + until),
        }
        # imported, not run as __main__: the job's name is tests.apscheduler_procs.tick
        argv = [sys.executable, "-c", "from tests.apscheduler_procs import main; main()"]
        self.procs = [subprocess.Popen(argv, env={**env, NODE_VAR: f"host-{n}"}, cwd=REPO) for n in range(3)]

    def lines(self, kind: str) -> list[list[str]]:
        text = self.out.read_text() if self.out.exists() else ""
        return [line.split()[1:] for line in text.splitlines() if line.split()[0] == kind]

    def wait(self) -> None:
        for proc in self.procs:
            assert proc.wait(timeout=60) == 0

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def hosts() -> Iterator[list[Hosts]]:
    started: list[Hosts] = []
    yield started
    for each in started:
        each.kill()


def dropped(url: str) -> int:
    """The duplicates the store counted for the hosts' job."""
    backend = uniqjob.backend_from_url(url)
    return backend.duplicates().get("tests.apscheduler_procs.tick", 0)


@pytest.mark.slow
def test_three_hosts_run_each_tick_once(store_url: str, tmp_path: Path, hosts: list[Hosts]) -> None:
    hosts.append(run := Hosts(store_url, tmp_path / "ran", until=6))
    run.wait()
    ticks = [math.floor(float(t) + 0.1) for _, t in run.lines("start")]
    assert len(ticks) >= 3 and len(ticks) == len(set(ticks))  # several ticks, none run twice
    calls = [(int(c), int(r)) for _, c, r in run.lines("calls")]
    assert len(calls) == 3 and all(c >= 2 for c, _ in calls)  # every host fired, ran or dropped
    assert sum(r for _, r in calls) == len(ticks)
    assert dropped(store_url) == sum(c - r for c, r in calls) >= 3  # every refused call counted


@pytest.mark.slow
def test_a_long_run_never_overlaps_the_next_tick(store_url: str, tmp_path: Path, hosts: list[Hosts]) -> None:
    hosts.append(run := Hosts(store_url, tmp_path / "ran", until=7, sleep=2.2))
    run.wait()
    starts, ends = run.lines("start"), run.lines("end")
    assert len(starts) == len(ends) >= 2
    spans = sorted((float(s[1]), float(e[1])) for s, e in zip(starts, ends, strict=True))
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), spans
    assert dropped(store_url) >= 2  # the ticks fired while a run lasted: counted drops


@pytest.mark.slow
def test_a_killed_host_s_lock_is_reclaimed_and_a_later_tick_runs_elsewhere(
    store_url: str, tmp_path: Path, hosts: list[Hosts]
) -> None:
    hosts.append(run := Hosts(store_url, tmp_path / "ran", until=60, sleep=60, lease=2))
    deadline = time.monotonic() + 30
    while not run.lines("start") and time.monotonic() < deadline:
        time.sleep(0.05)
    [(victim, _)] = run.lines("start")
    os.kill(int(victim), signal.SIGKILL)
    killed = time.time()
    deadline = time.monotonic() + 30
    while len(run.lines("start")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    starts = run.lines("start")
    assert len(starts) >= 2, starts  # a run after the kill (none beside the first before it)
    later, at = starts[1]
    assert later != victim and float(at) > killed


def test_the_benchmark_section_counts_one_round_trip_for_a_refused_tick() -> None:
    argv = ["--only", "apscheduler", "--iterations", "20", "--warmup", "2", "--counted", "3", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    trips = {row["id"]: row["extra"]["round trips to the locks"] for row in report["rows"]}
    assert trips == {
        "apscheduler.plain": 0,
        "apscheduler.duplicate": 1,
        "apscheduler.run": 3,
        "apscheduler.refused": 1,
    }
    targets = {target["id"]: target for target in report["targets"]}
    assert targets["apscheduler.refused.trips"]["met"] and targets["apscheduler.run.trips"]["met"]
