"""``once_per``: cron on every host, one run per tick of the store's clock.

Several "hosts" (processes, each with its own host identity) fire the same
tick on the file store and on a real redis-server; clocks near a tick
boundary are injected (the file store's), never slept through.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import redis

import uniqjob
from tests.conftest import FakeClock
from tests.integration_workers import NODE_VAR, REPO
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, FileBackend, MemoryBackend, UniqueJob
from uniqjob._ticks import MAX_SKEW, parse_period, skew, tick_key, tick_of
from uniqjob.cli import _run, main

# A host: `uniqjob run` in a process whose holder identity is its own (tests.integration_workers).
HOST = (
    "import sys; from tests.integration_workers import pretend_other_host; pretend_other_host();"
    " from uniqjob.cli import main; sys.exit(main(sys.argv[1:]))"
)
# The command each host runs: records the tick's lock key it ran under.
RECORD = "import os, sys; open(sys.argv[1], 'a').write(os.environ['UNIQJOB_KEY'] + '\\n')"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("1d", 86400), ("90", 90), (" 2M ", 120), ("1.5h", 5400)],
)
def test_periods(text: str, seconds: float) -> None:
    assert parse_period(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1m", "0", "0s", "inf", "nan", "m", "1e400s"])
def test_bad_periods(text: str) -> None:
    with pytest.raises(ConfigurationError, match="bad period"):
        parse_period(text)


def test_the_skew_allowed_is_a_tenth_of_the_period_at_most_a_minute() -> None:
    assert (skew(30), skew(300), skew(3600), skew(86400)) == (3, 30, MAX_SKEW, MAX_SKEW)


@pytest.mark.parametrize("store", ["memory", "file"])
def test_the_tick_is_the_store_s_clock_shifted_by_the_skew(store: str, tmp_path: Path) -> None:
    start = 300.0 * 6_000_000
    clock = FakeClock(start - 30 - 0.5)  # 30s (the skew of 5m) and a half before the boundary
    backend = MemoryBackend(clock=clock) if store == "memory" else FileBackend(tmp_path, clock=clock)
    before = tick_of(backend, "k", 300)
    assert before.number == 6_000_000 - 1 and before.key == "k:per-300s:5999999"
    assert before.ttl == pytest.approx(30.5)  # the lock lasts to the boundary: the skew's margin
    clock.advance(1)  # a host up to the skew early counts into the tick it meant
    after = tick_of(backend, "k", 300)
    assert after.number == 6_000_000 and after.ttl == pytest.approx(329.5)
    assert after.key == tick_key("k", 300, 6_000_000)


def test_on_redis_the_tick_is_the_server_s_time(redis_client: redis.Redis, redis_server: RedisServer) -> None:
    backend = uniqjob.backend_from_url(redis_server.url)
    seconds, micros = redis_client.time()
    before = seconds + micros / 1e6
    tick = tick_of(backend, "k", 30)
    seconds, micros = redis_client.time()
    after = seconds + micros / 1e6
    assert math.floor((before + 3) / 30) <= tick.number <= math.floor((after + 3) / 30)
    assert before <= (tick.number + 1) * 30 - tick.ttl <= after  # ttl: to the tick's end on its clock


# -- the command, in this process, on injected clocks -------------------------------------------


def hosts_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *clocks: FakeClock) -> list[FileBackend]:
    """One file store seen by several hosts, each through its own clock; the command opens them in turn."""
    backends = [FileBackend(tmp_path / "locks", clock=clock) for clock in clocks]
    queue = list(backends)
    monkeypatch.setattr(_run, "open_backend", lambda url: queue.pop(0))
    return backends


def run(ran: Path, *options: str) -> int:
    return main(["run", *options, "--", sys.executable, "-c", RECORD, str(ran)])


def test_a_quick_run_keeps_its_tick_from_the_next_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    boundary = 3600.0 * 500_000
    first, late = FakeClock(boundary + 1), FakeClock(boundary + 40)  # host B fires 39s after A
    hosts_on(
        tmp_path, monkeypatch, first, late, FakeClock(boundary + 3600 - 60 - 1), FakeClock(boundary + 3540)
    )
    ran = tmp_path / "ran"
    assert run(ran, "--once-per", "1h") == 0  # done long before B fires: until_executed would run B too
    assert run(ran, "--once-per", "1h", "--conflict-exit", "3") == 3
    assert "already run in this 3600s tick" in capsys.readouterr().err
    assert run(ran, "--once-per", "1h") == 75  # the tick's last second before the skew's shift
    assert run(ran, "--once-per", "1h") == 0  # the next tick, a skew (60s) early
    keys = ran.read_text().splitlines()
    assert [key.rsplit(":", 1)[1] for key in keys] == ["500000", "500001"]


def test_a_host_ahead_of_the_store_within_the_skew_counts_into_the_tick_it_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One store clock (as Redis's TIME is), and cron fired by hosts' clocks: a host 25s
    # ahead fires at 25s before the boundary on the store's clock; the skew of 5m is 30s.
    boundary = 300.0 * 7_000_000
    hosts_on(
        tmp_path, monkeypatch, FakeClock(boundary - 25), FakeClock(boundary + 2), FakeClock(boundary - 40)
    )
    ran = tmp_path / "ran"
    assert run(ran, "--once-per", "5m") == 0
    assert run(ran, "--once-per", "5m") == 75  # the on-time host, the same tick
    # beyond the bound: 40s early falls into the previous tick (free here: it runs)
    assert run(ran, "--once-per", "5m") == 0
    assert [key.rsplit(":", 1)[1] for key in ran.read_text().splitlines()] == ["7000000", "6999999"]


def test_the_tick_s_lock_stays_after_a_failed_run_and_lapses_when_the_tick_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(60.0 * 10_000_000 + 5)
    backend, *_ = hosts_on(tmp_path, monkeypatch, clock, clock, clock)
    command = [sys.executable, "-c", "raise SystemExit(4)"]
    assert main(["run", "--once-per", "1m", "--", *command]) == 4
    key = tick_key(_run.command_key(command), 60, 10_000_000)
    state = backend.read(key)
    assert state.run is None and state.queue is not None and state.queue.state == "queued"
    assert state.queue.ttl == pytest.approx(55)
    assert main(["run", "--once-per", "1m", "--", *command]) == 75  # a failed run is not retried
    clock.advance(55)  # the tick has ended: its lock is gone, the next tick's key is another
    assert backend.read(key).queue is None
    assert main(["run", "--once-per", "1m", "--", *command]) == 4


def test_bad_once_per_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--once-per", "5x", "--", "true"]) == 64
    assert "argument --once-per: bad period '5x'" in capsys.readouterr().err
    assert main(["run", "--once-per", "0.5", "--", "true"]) == 64
    assert "a tick must be at least 1s" in capsys.readouterr().err
    assert main(["run", "--once-per", "5m", "--wait", "10", "--", "true"]) == 64
    assert "--wait has no use with --once-per" in capsys.readouterr().err


# -- several hosts, as real processes ------------------------------------------------------------


@pytest.fixture(params=["file", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "locks").as_uri()
    request.getfixturevalue("redis_client")  # flushes the database
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


def fire(url: str, ran: Path, hosts: int, *options: str) -> list[int]:
    """Start ``hosts`` hosts at once, each running the same ``uniqjob run --once-per 1d``; their statuses."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-c", HOST, "run", "--url", url, "--once-per", "1d", *options]
    argv += ["--", sys.executable, "-c", RECORD + "; import time; time.sleep(0.2)", str(ran)]
    procs = [
        subprocess.Popen(argv, env={**os.environ, NODE_VAR: f"host-{n}", "PYTHONPATH": path}, cwd=REPO)
        for n in range(hosts)
    ]
    return [proc.wait(timeout=60) for proc in procs]


@pytest.mark.slow
def test_hosts_firing_the_same_tick_run_it_once(shared_url: str, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    statuses = fire(shared_url, ran, 6)
    again = fire(shared_url, ran, 3)  # later in the same tick (the first run finished): still none
    keys = ran.read_text().splitlines()
    # A run is per tick's key; a day's boundary crossed mid-test would be a second tick, run once too.
    assert len(keys) == len(set(keys)) >= 1
    assert sorted(statuses + again) == [0] * len(keys) + [75] * (9 - len(keys))
    assert all(":per-86400s:" in key for key in keys)


# -- the job setting -----------------------------------------------------------------------------


def test_a_job_class_with_once_per_runs_once_per_tick() -> None:
    clock = FakeClock(900.0 * 2_000_000)
    uniqjob.configure(MemoryBackend(clock=clock))

    class Nightly(UniqueJob):
        unique_once_per = timedelta(minutes=15)

        def perform(self, region: str) -> str:
            return region

    assert Nightly.run("eu") == "eu"
    assert Nightly.run("eu") is None and Nightly.run("us") == "us"
    assert Nightly.is_locked("eu")
    lock = Nightly.lock("eu")
    assert lock.key == tick_key(Nightly.lock_key("eu"), 900, 2_000_000) and lock.strategy == "until_expired"
    clock.advance(900 - 60)  # within the skew (a minute at most) of the next tick
    assert Nightly.run("eu") == "eu"


def test_once_per_settings_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError, match=r"Bad.unique_once_per: bad period 'daily'"):

        class Bad(UniqueJob):
            unique_once_per = "daily"

            def perform(self) -> None: ...

    with pytest.raises(ConfigurationError, match=r"Worse.unique_once_per must be positive and finite"):

        class Worse(UniqueJob):
            unique_once_per = -5

            def perform(self) -> None: ...
