"""``uniqjob run`` through a Redis stall, end to end (issue 10, bug 1): never two commands at once.

The bug: ``uniqjob run --url redis://… --lease 9 --key nightly -- sh -c 'sleep 22'``
with redis-server stopped (SIGSTOP) 1.5 s in, for 7 s. The heartbeat's first
renewal connected during the stall and every later one failed; the lease lapsed,
and a second identical run started its command beside the first. Here the times
are scaled down (lease 3 s: renewals every second, presumed lost 2 s after the
last confirmed one; a socket timeout of 1 s), on a redis-server of this module's own.

Each command appends a wall-clock timestamp to a file of its own every 20 ms
while it runs, so "at once" is read from what the commands themselves wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import (
    module_redis_server,  # noqa: F401 - the `server` fixture
    sigstop,
)

UNIQJOB = (sys.executable, "-m", "uniqjob")
LEASE = "3"

# Writes the time to $1 every 20 ms for $2 seconds, less a fraction (whole seconds of the wall
# clock); first its key and fence to $1.env.
TICKER = """\
echo "$UNIQJOB_KEY ${UNIQJOB_FENCE-none}" > "$1.env"
end=$(($(date +%s) + $2))
while [ "$(date +%s)" -lt "$end" ]; do date +%s.%N >> "$1"; sleep 0.02; done
"""


@pytest.fixture
def url(server: RedisServer) -> Iterator[str]:
    """The module's server, flushed; running again (SIGCONT) after the test whatever happened."""
    import redis

    redis.Redis.from_url(server.url).flushall()
    yield server.url
    if server.pid is not None:
        os.kill(server.pid, signal.SIGCONT)


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _kill_leftovers() -> Iterator[None]:
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def run(
    url: str,
    ticks: Path,
    seconds: int,
    *options: str,
    lease: str = LEASE,
    timeout: str = "1",
    ticker: str = TICKER,
) -> subprocess.Popen[str]:
    """Start ``uniqjob run --key nightly`` of a command that ticks into ``ticks`` for ``seconds``."""
    url += f"?socket_timeout={timeout}&socket_connect_timeout={timeout}"
    argv = [*UNIQJOB, "run", "--url", url, "--lease", lease, "--key", "nightly", *options, "--"]
    proc = subprocess.Popen(
        [*argv, "sh", "-c", ticker, "ticker", str(ticks), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _started.append(proc)
    return proc


def ticks(path: Path) -> list[float]:
    try:
        return [float(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


def wait_for_ticks(path: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not ticks(path):
        assert time.monotonic() < deadline, f"{path.name}: the command never started"
        time.sleep(0.01)


@pytest.mark.slow
def test_a_stall_past_the_margin_stops_the_command_before_a_second_run_can_start(
    server: RedisServer, url: str, tmp_path: Path
) -> None:
    first_ticks, second_ticks = tmp_path / "first", tmp_path / "second"
    first = run(url, first_ticks, 8)
    wait_for_ticks(first_ticks)
    assert server.pid is not None
    sigstop(server.pid)  # before the first renewal: its connect (a thread's first) stalls, fails after 1 s
    time.sleep(2.5)  # past lease less margin (2 s)
    os.kill(server.pid, signal.SIGCONT)
    second = run(url, second_ticks, 2, "--wait", "15")  # takes the lock once the lease has lapsed
    status, err = first.wait(20), first.communicate()[1]
    second_status, second_err = second.wait(20), second.communicate()[1]

    assert status == 143, err  # SIGTERM ended the command
    why = [line for line in err.splitlines() if "presumed lost" in line]
    assert len(why) == 1, err
    assert "lock 'nightly' presumed lost: the store confirmed no renewal for" in why[0]
    assert second_status == 0, second_err
    # Never two commands at once: the first had stopped ticking before the second began.
    assert ticks(first_ticks) and ticks(second_ticks)
    assert max(ticks(first_ticks)) < min(ticks(second_ticks))
    # Each run's command got its key and fence; a later grant's fence is greater.
    (key1, fence1), (key2, fence2) = (
        (tmp_path / f"{name}.env").read_text().split() for name in ("first", "second")
    )
    assert key1 == key2 == "nightly"
    assert int(fence2) > int(fence1) > 0


@pytest.mark.slow
def test_a_command_that_ignores_sigterm_is_killed_before_the_lease_can_lapse(
    server: RedisServer, url: str, tmp_path: Path
) -> None:
    # --grace 30 would leave it running long after the lease lapsed: SIGKILL comes within the margin.
    first_ticks = tmp_path / "first"
    first = run(url, first_ticks, 8, "--grace", "30", ticker="trap '' TERM\n" + TICKER)
    wait_for_ticks(first_ticks)
    assert server.pid is not None
    stopped_at = time.time()  # no renewal sent after this can be confirmed
    sigstop(server.pid)
    time.sleep(3.2)
    os.kill(server.pid, signal.SIGCONT)
    status, err = first.wait(20), first.communicate()[1]
    assert status == 137, err  # only SIGKILL could end it
    # The last confirmed renewal was sent before the stall: its lease ends by stopped_at + 3 s.
    assert max(ticks(first_ticks)) < stopped_at + float(LEASE)
    assert len([line for line in err.splitlines() if "presumed lost" in line]) == 1, err
    assert "SIGKILL" not in err


@pytest.mark.slow
def test_a_stall_that_fails_the_first_renewal_heals_and_keeps_the_lock(
    server: RedisServer, url: str, tmp_path: Path
) -> None:
    # Lease 6: renewals every 2 s, presumed lost 4 s after the last confirmed one.
    # The stall spans the first renewal, whose connect fails (socket timeout 0.5 s);
    # its retry, a second later, must be confirmed, and so must every renewal after it.
    first_ticks, second_ticks = tmp_path / "first", tmp_path / "second"
    first = run(url, first_ticks, 20, lease="6", timeout="0.5")
    wait_for_ticks(first_ticks)
    began = time.monotonic()
    assert server.pid is not None
    time.sleep(1.7)
    sigstop(server.pid)
    time.sleep(1.1)  # over at 2.8 s: the renewal of 2 s has failed at 2.5 s, its retry comes at 3.5 s
    os.kill(server.pid, signal.SIGCONT)
    time.sleep(max(0.0, began + 6.4 - time.monotonic()))  # unrenewed, the lease would have lapsed by now
    second = run(url, second_ticks, 1, lease="6")
    second_status, second_err = second.wait(20), second.communicate()[1]
    assert first.poll() is None  # still running its command, under its lock
    first.terminate()  # passed on to the command: done with it
    status, err = first.wait(20), first.communicate()[1]
    assert second_status == 75, (second_err, err)  # the first run still holds the lock
    assert "held by pid" in second_err
    assert status == 143, err
    assert "presumed lost" not in err and "released by force" not in err
    assert not ticks(second_ticks)


@pytest.mark.slow
def test_a_taken_lock_stops_the_command_with_one_line(url: str, tmp_path: Path) -> None:
    first_ticks = tmp_path / "first"
    first = run(url, first_ticks, 8)
    wait_for_ticks(first_ticks)
    released = subprocess.run(
        [*UNIQJOB, "release", "--url", url, "--force", "nightly"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert released.returncode == 0, released.stderr
    status, err = first.wait(20), first.communicate()[1]
    assert status == 143, err
    lines = [line for line in err.splitlines() if "released by force, or expired and taken" in line]
    assert lines == [line for line in err.splitlines() if "nightly" in line] and len(lines) == 1, err


@pytest.mark.slow
def test_a_lock_lost_after_the_time_limits_sigterm_still_brings_the_sigkill_forward(tmp_path: Path) -> None:
    """--kill-after's SIGTERM came first; a later loss must still end the command before the lease lapses."""
    import fcntl

    from uniqjob.stores.file import FileBackend

    store = tmp_path / "store"
    log = tmp_path / "log"
    url = f"file://{store}"
    stubborn = f'trap "" TERM; while true; do date +%s.%N >> {log}; sleep 0.1; done'
    run = [
        *UNIQJOB,
        "run",
        "--url",
        url,
        "--key",
        "k",
        "--lease",
        "3",
        "--kill-after",
        "0.5",
        "--grace",
        "30",
    ]
    first = subprocess.Popen([*run, "--", "sh", "-c", stubborn], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(log.exists, "the command to start", 10)
        time.sleep(0.8)  # past --kill-after: SIGTERM sent, and ignored
        _path, stripe = FileBackend(store)._stripes.of("k")
        fd = os.open(store / ".locks" / f"{stripe:02d}.lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # the store stalls: renewals hang, the lock is presumed lost
        stalled = time.time()
        time.sleep(4.0)  # past the lease (3 s) from the last renewal
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        assert first.wait(30) == 137  # SIGKILLed: it ignored SIGTERM, and --grace is 30 s
    finally:
        if first.poll() is None:
            first.kill()
    last = float(log.read_text().split()[-1])
    assert last < stalled + 3.0  # nothing of it ran once the lease could lapse
    assert first.stderr is not None
    assert "presumed lost" in first.stderr.read()


def test_a_key_that_is_not_text_is_bad_usage_not_an_outage(tmp_path: Path) -> None:
    done = subprocess.run(
        [*UNIQJOB, "run", "--url", f"file://{tmp_path / 'store'}", "--key", "\udcff\udcfe", "--", "true"],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        check=False,
    )
    assert done.returncode == 64
    assert "--key must be text" in done.stderr
