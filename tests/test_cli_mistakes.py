"""The command line's quiet cases, --namespace, and the options that used to pass silently."""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from pathlib import Path

import pytest

import uniqjob
from tests.concurrency_jobs import QUEUE, Limited
from tests.redis_server import RedisServer
from tests.test_cli import Hold, finish, kill_leftovers
from tests.test_cli import uniqjob as uniqjob_cmd
from uniqjob import UniqueJob
from uniqjob.cli import build_parser, main
from uniqjob.cli._common import store_url, wait_seconds
from uniqjob.errors import ConfigurationError
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.settings import MAX_RUN_LEASE, MIN_RUN_LEASE
from uniqjob.stores.redis import RedisBackend

__all__ = ["kill_leftovers"]  # a fixture shared with test_cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def redis_url(redis_server: RedisServer, redis_client: object) -> str:
    return redis_server.url  # flushed by redis_client


# -- --namespace ---------------------------------------------------------------------------


def test_locks_of_a_namespaced_backend_are_seen_with_namespace(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import redis

    backend = RedisBackend(redis.Redis.from_url(redis_url), namespace="myapp")
    assert backend.claim("report-1", "t1", meta=QueueMeta("app.Report", "1", "")) is None
    assert run(capsys, "locks", "--url", redis_url, "--json")[1] == ""  # the default namespace: not there
    for argv in (
        ["--url", redis_url, "--namespace", "myapp"],
        ["--url", redis_url + "?namespace=myapp"],
        ["--url", redis_url + "?namespace=myapp", "--namespace", "myapp"],  # both, agreeing
    ):
        status, out, err = run(capsys, "locks", "--json", *argv)
        assert status == 0, err
        assert [json.loads(line)["key"] for line in out.splitlines()] == ["report-1"]
    status, out, _ = run(capsys, "release", "report-1", "--url", redis_url, "--namespace", "myapp")
    assert status == 0 and "released report-1" in out
    assert backend.read("report-1").free


def test_namespace_keeps_a_unix_socket_url(
    redis_server: RedisServer, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``unix:///path.sock`` was rebuilt as ``unix:/path.sock``: exit 78, an unsupported URL."""
    assert store_url("unix:///run/redis.sock", "app") == "unix:///run/redis.sock?namespace=app"
    assert store_url("unix:///run/redis.sock?db=2", "app") == "unix:///run/redis.sock?db=2&namespace=app"
    backend = RedisBackend(redis_url, namespace="myapp")
    assert backend.claim("report-1", "t1", meta=QueueMeta("app.Report", "1", "")) is None
    assert redis_server.unix_url.startswith("unix:///")
    status, out, err = run(capsys, "locks", "--json", "--url", redis_server.unix_url, "--namespace", "myapp")
    assert status == 0, err
    assert [json.loads(line)["key"] for line in out.splitlines()] == ["report-1"]


def test_namespace_from_the_environment_and_its_mistakes(
    redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("UNIQJOB_URL", redis_url)
    assert store_url(None, "myapp") == redis_url + "?namespace=myapp"
    assert store_url(redis_url + "?timeout=2", "a b") == redis_url + "?timeout=2&namespace=a+b"
    assert store_url(redis_url, None) == redis_url
    status, _, err = run(capsys, "locks", "--url", redis_url + "?namespace=one", "--namespace", "two")
    assert status == 64
    assert "--namespace 'two' and the URL's ?namespace=one differ: give one of them" in err
    status, _, err = run(capsys, "reap", "--url", f"file://{tmp_path}", "--namespace", "x")
    assert status == 64 and "--namespace applies to Redis stores; a file:// store has none" in err
    monkeypatch.delenv("UNIQJOB_URL")
    status, _, err = run(capsys, "locks", "--namespace", "x")
    assert status == 64 and "--namespace needs a Redis store" in err
    status, _, err = run(capsys, "locks", "--url", redis_url, "--namespace", "a{b}")
    assert status == 78 and "no '{' or '}'" in err  # the store's own check of the URL option


def _subcommands() -> list[str]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(action.choices)


@pytest.mark.parametrize("sub", _subcommands())
def test_every_subcommand_takes_namespace(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([sub, "--help"]) == 0
    assert "--namespace NAME" in capsys.readouterr().out


@pytest.mark.parametrize("sub", ["run", "locks", "release", "reap", "discard-parked"])
def test_the_lock_subcommands_take_quiet(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([sub, "--help"]) == 0
    assert "-q, --quiet" in capsys.readouterr().out


# -- quiet -----------------------------------------------------------------------------------


def test_reap_counts_and_quiet_speaks_only_of_a_reclaim(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    uniqjob.configure(redis_url)
    backend = uniqjob.default_backend()
    assert run(capsys, "reap", "--url", redis_url) == (0, "", "reclaimed 0 orphaned lock(s) of 0 held\n")
    assert run(capsys, "reap", "--url", redis_url, "--quiet") == (0, "", "")
    assert backend.claim("waiting", "t-w", meta=QueueMeta("app.Job", "", "")) is None
    assert run(capsys, "reap", "--url", redis_url, "-q") == (0, "", "")  # a queued lock is no orphan
    lapsed = RunClaim(local_holder(), lease=0.001)
    assert backend.claim("crashed", "t-c", meta=QueueMeta(), run=lapsed) is None
    time.sleep(0.01)  # its lease lapses on the server's clock
    status, out, err = run(capsys, "reap", "--url", redis_url, "--quiet")  # a reclaim is news for cron's mail
    assert status == 0 and out.startswith("reclaimed crashed (running")
    assert err == "reclaimed 1 orphaned lock(s) of 2 held\n"
    assert backend.read("crashed").free
    assert run(capsys, "locks", "--url", redis_url, "--quiet", "--class", "Nope") == (0, "", "")


def test_locks_shows_a_parked_job_as_parked(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    uniqjob.configure(redis_url)
    QUEUE.pushed.clear()
    for n in range(3):
        Limited.enqueue(1, n)  # two take the slots, the third parks
    status, out, err = run(capsys, "locks", "--url", redis_url, "--json")
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["state"] for r in rows) == ["parked", "queued", "queued"]
    (parked,) = [r for r in rows if r["state"] == "parked"]
    assert parked["args"] == "1, 2" and parked["job_id"] is None
    QUEUE.pushed.clear()


def test_top_without_concurrency_is_a_usage_error(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "locks", "--url", redis_url, "--top", "5")
    assert (status, out) == (64, "")
    assert "--top counts concurrency keys: give it with --concurrency" in err


# -- leases and waits -----------------------------------------------------------------------


@pytest.mark.parametrize("lease", ["0.1", "0.99", "1e308", "86401", "inf", "nan"])
def test_a_lease_out_of_range_is_a_usage_error(lease: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "run", "--lease", lease, "--", "true")
    assert status == 64, err
    assert "--lease" in err and err.count("\n") == 1


def test_the_lease_range_is_stated_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"({MIN_RUN_LEASE:g} to {MAX_RUN_LEASE:g}; default: 30)" in text
    assert "65 a lock record that cannot be read" in text and "70 internal error" in text


@pytest.mark.parametrize(
    ("lease", "ok"), [(0.01, False), (0.5, False), (1, True), (86400, True), (86401, False)]
)
def test_a_class_run_lease_out_of_range_is_refused(lease: float, ok: bool) -> None:
    def define() -> type[UniqueJob]:
        return type("Job", (UniqueJob,), {"unique_run_lease": lease, "perform": lambda self: None})

    if ok:
        assert define().unique_run_lease == lease
        return
    with pytest.raises(ConfigurationError, match=r"Job\.unique_run_lease must be 1 to 86400 seconds"):
        define()


@pytest.mark.slow
def test_wait_inf_takes_the_lock_once_the_holder_ends(tmp_path: Path) -> None:
    assert wait_seconds("inf") == math.inf and wait_seconds("2.5") == 2.5
    hold = Hold(tmp_path)
    holder = hold.start()
    hold.wait_running()
    threading.Timer(1.0, hold.release).start()
    began = time.monotonic()
    result = uniqjob_cmd("run", "--wait", "inf", "--", *hold.argv)  # the same key: it waits
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began >= 0.9
    assert finish(holder)[0] == 0


# -- release --force --------------------------------------------------------------------------


@pytest.mark.slow
def test_release_force_of_a_live_lock_warns_that_its_job_may_still_run(
    redis_url: str, tmp_path: Path
) -> None:
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", redis_url, "--lease", "30")
    hold.wait_running()
    result = uniqjob_cmd("release", "--url", redis_url, "--force", hold.key)
    assert result.returncode == 0
    assert f"WARNING: released {hold.key!r} from a live holder, pid {wrapper.pid}" in result.stderr
    assert "its job is probably still running, now unlocked" in result.stderr
    assert finish(wrapper)[0] == 143  # and the holder noticed, and stopped its command
    again = uniqjob_cmd("release", "--url", redis_url, "--force", hold.key)
    assert again.returncode == 1 and "WARNING" not in again.stderr


# -- --overlap ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--overlap", "buffer-one", "--once-per", "5m"], "--overlap buffer-one has no use with --once-per"),
        (["--overlap", "terminate-other", "--wait", "10"], "--overlap terminate-other waits as long as the"),
        (
            ["--overlap", "later"],
            "invalid choice: 'later' (choose from 'skip', 'buffer-one', 'terminate-other')",
        ),
    ],
)
def test_overlap_mistakes_are_usage_errors(
    options: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "run", *options, "--", "true")
    assert status == 64 and needle in err and err.count("\n") == 1, err


def test_overlap_skip_is_todays_behaviour(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    hold = Hold(tmp_path)
    holder = hold.start("--url", url)
    hold.wait_running()
    done = uniqjob_cmd("run", "--url", url, "--overlap", "skip", "--", *hold.argv)
    assert done.returncode == 75 and "is held by pid" in done.stderr
    hold.release()
    assert finish(holder)[0] == 0
