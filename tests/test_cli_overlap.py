"""``uniqjob run --overlap buffer-one | terminate-other``, across two hosts' worth of processes on one Redis.

Each ``uniqjob run`` is a process of its own that names itself after a host (``on_host``): to
the others it is a holder whose pid they cannot check, as on another machine, so only the
store (its records, the run lock's lease) connects them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.test_backend_contract import LEASE, ME, META, OTHER, Store, overlap, store
from tests.test_cli import finish, kill_leftovers, start, uniqjob, wait_for
from uniqjob.locks import RunClaim

__all__ = ["kill_leftovers", "store"]  # fixtures: kills what a failed test leaves running; each store

PY = sys.executable

# Appends "start PID" to the file argv[1]; on SIGTERM appends "stopped PID" and exits 143; else waits
# for the file argv[2] (at most 30s), then appends "end PID".
RECORD = """\
import os, signal, sys, time
log, go = sys.argv[1], sys.argv[2]
def say(what):
    with open(log, "a") as f:
        f.write(f"{what} {os.getpid()}\\n")
def stopped(signum, frame):
    say("stopped")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
say("start")
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
say("end")
"""


def on_host(host: str) -> tuple[str, ...]:
    """``python -m uniqjob``, as a process of host ``host`` (its holder's host name)."""
    code = (
        "import sys, uniqjob.locks as locks\n"
        f"locks._hostname = lambda: {host!r}\n"
        "from uniqjob.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return (PY, "-c", code)


def lines(log: Path) -> list[str]:
    return log.read_text().split("\n")[:-1] if log.exists() else []


@pytest.fixture
def url(redis_server: RedisServer, redis_client: object) -> str:
    return redis_server.url  # flushed by redis_client


def run_on(host: str, url: str, log: Path, go: Path, *options: str) -> subprocess.Popen[str]:
    argv = ("run", "--url", url, "--key", "nightly", *options, "--", PY, "-c", RECORD, str(log), str(go))
    return start(*argv, prefix=on_host(host))


def test_buffer_one_runs_once_more_after_the_holder_however_many_overlap(url: str, tmp_path: Path) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    first = run_on("host-a", url, log, go, "--overlap", "buffer-one")
    wait_for(lambda: len(lines(log)) == 1, what="the first run to start")
    others = [run_on(f"host-{'ab'[n % 2]}", url, log, go, "--overlap", "buffer-one") for n in range(9)]
    wait_for(lambda: sum(p.poll() is not None for p in others) == 8, timeout=30, what="8 runs to coalesce")
    (waiting,) = [p for p in others if p.poll() is None]
    for proc in others:
        if proc is not waiting:
            status, _, err = finish(proc)
            assert status == 0 and err.count("\n") == 1 and "another run waits to run after" in err, err
    listed = json.loads(uniqjob("locks", "--url", url, "--json").stdout)
    assert listed["key"] == "nightly" and listed["pending_run"].endswith(f":{waiting.pid}")
    assert lines(log) == [f"start {lines(log)[0].split()[1]}"]  # the pending run waits

    go.touch()
    assert finish(first)[0] == 0 and finish(waiting)[0] == 0
    starts = [line for line in lines(log) if line.startswith("start")]
    assert len(starts) == 2  # ten invocations, two runs
    assert [line.split()[0] for line in lines(log)] == ["start", "end", "start", "end"]  # never at once
    later = run_on("host-b", url, log, go, "--overlap", "buffer-one")  # nothing runs or waits: it runs
    assert finish(later)[0] == 0 and len(lines(log)) == 6


def test_terminate_other_stops_the_holder_on_another_host_then_runs(url: str, tmp_path: Path) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    old = run_on("host-a", url, log, go, "--lease", "3")
    wait_for(lambda: len(lines(log)) == 1, what="the holder to start")
    new = run_on("host-b", url, log, tmp_path / "go-new", "--overlap", "terminate-other")
    wait_for(lambda: len(lines(log)) == 3, timeout=20, what="the new run to start")
    status, _, err = finish(old)
    assert status == 143  # stopped with SIGTERM, as on a lost lock, before its lease lapsed
    assert "on host-b:" in err and "asked to take over 'nightly' (--overlap terminate-other)" in err, err
    old_pid = lines(log)[0].split()[1]
    assert lines(log)[:2] == [f"start {old_pid}", f"stopped {old_pid}"]  # stopped, then the new one started
    (tmp_path / "go-new").touch()
    status, _, err = finish(new)
    assert status == 0 and "asked the run holding 'nightly' to stop" in err


@pytest.mark.slow
def test_terminate_other_waits_no_longer_than_the_lease_of_a_frozen_holder(url: str, tmp_path: Path) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    old = run_on("host-a", url, log, go, "--lease", "2")
    wait_for(lambda: len(lines(log)) == 1, what="the holder to start")
    os.kill(old.pid, signal.SIGSTOP)  # its heartbeat is frozen: it cannot learn it was asked to stop
    try:
        began = time.monotonic()
        new = run_on("host-b", url, log, tmp_path / "go-new", "--overlap", "terminate-other", "-q")
        wait_for(lambda: len(lines(log)) == 2, timeout=20, what="the new run to start once the lease lapsed")
        assert time.monotonic() - began > 1  # not before: the frozen holder's lease was still live
    finally:
        os.kill(old.pid, signal.SIGCONT)
    status, _, err = finish(old)
    assert status in (137, 143), err  # thawed, it finds its lock lost and stops its command at once
    (tmp_path / "go-new").touch()
    assert finish(new)[:2] == (0, "")


# -- the store's side of buffer-one's promise (Backend.overlap's "follow"), on every store -------------


def test_the_holder_watches_the_pending_run_take_the_key(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "b", "buffer", lease=10) == "pending"
    assert overlap(b, "c", "buffer") == "coalesced"
    assert overlap(b, "a", "follow") == "coalesced"  # a ends: b waits, a watches it
    b.finish("k", "a")
    assert overlap(b, "a", "follow") == "coalesced"  # b has not taken the key yet
    assert overlap(b, "b", "buffer") == "free"
    assert b.claim("k", "b", meta=META, run=RunClaim(OTHER, 10)) is None
    assert overlap(b, "b", "withdraw", lease=10) == "free"
    assert b.read("k").pending_run == ""
    assert overlap(b, "a", "follow") == "free"  # b took the key: it ran for c
    assert overlap(b, "d", "buffer", lease=10) == "pending"  # behind b, as ever
    assert overlap(b, "b", "follow") == "coalesced" and overlap(b, "e", "buffer") == "coalesced"


def test_the_holder_owes_a_run_to_runs_coalesced_into_a_pending_run_that_is_gone(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "a", "follow") == "free"  # nothing waited behind it
    assert overlap(b, "b", "buffer", lease=10) == "pending"
    assert overlap(b, "c", "buffer") == "coalesced"
    assert overlap(b, "b", "withdraw") == "free"  # b stopped by a signal, without the key
    assert overlap(b, "a", "follow") == "pending"  # c counted on b: a runs once more
    b.finish("k", "a")
    assert b.claim("k", "x", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "y", "buffer") == "pending"  # its place lapses with the lease it gave
    assert overlap(b, "x", "follow") == "coalesced"
    b.finish("k", "x")
    store.advance(LEASE + 0.1)  # y died waiting
    assert overlap(b, "x", "follow") == "pending"


def test_a_run_that_takes_the_key_after_the_holder_ran_for_the_runs_it_watched(store: Store) -> None:
    b = store.backend
    assert b.claim("k", "a", meta=META, run=RunClaim(ME, 10)) is None
    assert overlap(b, "b", "buffer", lease=10) == "pending"
    assert overlap(b, "c", "buffer") == "coalesced"
    assert overlap(b, "a", "follow") == "coalesced"
    b.finish("k", "a")
    assert b.claim("k", "x", meta=META, run=RunClaim(ME, 10)) is None  # a run without --overlap
    assert overlap(b, "a", "follow") == "free"  # x started after a: the holder of a is done
    assert b.read("k").pending_run == "host-b:4242"  # b still waits, now behind x


# A run whose store fails (BackendError) the first time it withdraws its pending place.
FAILING_WITHDRAW = """\
import sys
from uniqjob.errors import BackendError
from uniqjob.stores.redis import RedisBackend
real, failed = RedisBackend.overlap, []
def overlap(self, key, token, mode, **options):
    if mode == "withdraw" and not failed:
        failed.append(mode)
        raise BackendError("connection lost while reading the reply", "redis")
    return real(self, key, token, mode, **options)
RedisBackend.overlap = overlap
from uniqjob.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_whose_withdraw_fails_runs_and_leaves_no_place_behind(url: str, tmp_path: Path) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    first = run_on("host-a", url, log, go)
    wait_for(lambda: len(lines(log)) == 1, what="the first run to start")
    argv = ("run", "--url", url, "--key", "nightly", "--overlap", "buffer-one", "--", PY, "-c", RECORD)
    waiting = start(*argv, str(log), str(go), prefix=(PY, "-c", FAILING_WITHDRAW))
    wait_for(lambda: "pending_run" in uniqjob("locks", "--url", url, "--json").stdout, what="a pending run")
    go.touch()
    assert finish(first)[0] == 0
    status, _, err = finish(waiting)
    assert status == 0, err  # it took the key and ran, though its withdraw failed once
    assert [line.split()[0] for line in lines(log)] == ["start", "end", "start", "end"]
    assert json.loads(uniqjob("locks", "--url", url, "--json").stdout or "null") is None  # no place left
    later = run_on("host-b", url, log, go, "--overlap", "buffer-one")  # not swallowed by a stale place
    assert finish(later)[0] == 0 and len(lines(log)) == 6
