"""``uniqjob locks``, ``release`` and ``reap``, run for real against the file store and Redis."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.test_cli import PY, UNIQJOB, Hold, Store, finish, kill_leftovers, store, uniqjob
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim, local_holder
from uniqjob.ops import LockRow
from uniqjob.stores.redis import RedisBackend

__all__ = ["kill_leftovers", "store"]  # fixtures shared with test_cli

FIELDS = {
    "key", "class", "args", "job_id", "state", "host", "pid", "age_s", "ttl_s", "lease_s", "orphaned",
    "path", "reason", "pending_run", "stop_asked_by", "pending", "due_s",
}  # fmt: skip


def dead_holder() -> Holder:
    """A holder on this host whose process has exited: the orphan rule's clear case."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 12345)


def orphan(store: Store, key: str) -> None:
    """Leave a running lock on ``key`` whose holder is dead, as a crashed worker would."""
    claim = RunClaim(dead_holder(), lease=60)
    assert store.backend.claim(key, "t-" + key, meta=QueueMeta("app.jobs.Crashed", "7"), run=claim) is None


def queued(store: Store, key: str) -> None:
    """Leave a queued lock on ``key``, as an enqueue whose job waits in its queue does."""
    meta = QueueMeta("app.jobs.Export", "42, full=True", "job-1")
    assert store.backend.claim(key, "t-" + key, meta=meta, ttl=600) is None


def listing(store: Store, *options: str) -> list[dict[str, object]]:
    result = uniqjob("locks", "--url", store.url, "--json", *options)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_locks_json_describes_each_held_key(store: Store, tmp_path: Path) -> None:
    assert listing(store) == []
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", store.url, "--lease", "5")
    hold.wait_running()
    queued(store, "export-42")
    orphan(store, "crashed-7")
    rows = {row["key"]: row for row in listing(store)}
    assert set(rows) == {hold.key, "export-42", "crashed-7"}
    assert all(set(row) == FIELDS for row in rows.values())

    run = rows[hold.key]
    assert run["class"] == "uniqjob.cli.run" and str(run["args"]).startswith(f"{PY} -c 'import os")
    assert (run["state"], run["host"], run["pid"], run["orphaned"]) == (
        "running", socket.gethostname(), wrapper.pid, False,
    )  # fmt: skip
    assert 0 < float(run["lease_s"]) <= 5 and run["ttl_s"] is None  # type: ignore[arg-type]
    assert 0 <= float(run["age_s"]) < 30  # type: ignore[arg-type]

    export = rows["export-42"]
    assert export["class"] == "app.jobs.Export" and export["args"] == "42, full=True"
    assert export["state"] == "queued" and export["job_id"] == "job-1"
    assert run["job_id"] is None  # `uniqjob run` has no queue, so no job id
    assert export["host"] is None and export["lease_s"] is None and export["orphaned"] is False
    assert 0 < float(export["ttl_s"]) <= 600  # type: ignore[arg-type]

    assert rows["crashed-7"]["orphaned"] is True

    assert [r["key"] for r in listing(store, "--class", "Export")] == ["export-42"]
    assert [r["key"] for r in listing(store, "--class", "uniqjob.cli.run")] == [hold.key]
    assert listing(store, "--class", "Nope") == []

    table = uniqjob("locks", "--url", store.url)
    assert table.returncode == 0
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["STATE", "HOLDER", "AGE", "LEFT", "ORPHAN", "JOB", "JOB_ID", "OVERLAP", "KEY"]
    by_key = {line.split()[-1]: line for line in lines}
    assert f"{socket.gethostname()}:{wrapper.pid}" in by_key[hold.key]
    assert by_key["crashed-7"].split()[4] == "yes"
    assert "app.jobs.Export(42, full=True)" in by_key["export-42"]
    assert by_key["export-42"].split()[-3] == "job-1" and by_key[hold.key].split()[-3] == "-"  # JOB_ID
    hold.release()
    assert finish(wrapper)[0] == 0


def test_locks_on_an_empty_store_says_so(store: Store) -> None:
    result = uniqjob("locks", "--url", store.url)
    read = repr(store.backend)
    if isinstance(store.backend, RedisBackend):
        read += ", namespace 'uniqjob'"
    assert (result.returncode, result.stdout, result.stderr) == (0, "", f"no locks held in {read}\n")
    quiet = uniqjob("locks", "--url", store.url, "--quiet", "--class", "Nope")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")


def test_locks_names_the_namespaces_that_hold_locks(redis_server: RedisServer, redis_client: object) -> None:
    url = redis_server.url
    meta = QueueMeta("app.jobs.Export", "42")
    for namespace, key in (("myapp", "export-42"), ("a:b~", "}odd"), ("other", "x")):
        assert RedisBackend(url, namespace=namespace).claim(key, "t", meta=meta, ttl=600) is None
    slots = RedisBackend(url, namespace="slots").semaphores()  # a namespace of concurrency slots only
    me = local_holder()
    taken = slots.acquire(
        "k", "t", limit=1, lease=60, running=True, holder=me, park=None, job_class="J", args="", caller=me
    )
    assert taken.status == "taken"
    assert RedisBackend(url).namespaces() == ["a:b~", "myapp", "other"]
    assert RedisBackend(url).namespaces(limit=0) == []  # looks at nothing

    empty = uniqjob("locks", "--url", url)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == (
        f"no locks held in {RedisBackend(url)!r}, namespace 'uniqjob'; locks are held under namespace"
        " 'a:b~', 'myapp', 'other': add --namespace 'a:b~' to see them\n"
    )
    mine = uniqjob("locks", "--url", url, "--namespace", "myapp", "--class", "Nope")
    assert (
        mine.stderr.startswith("no locks of class 'Nope' held in ") and ", namespace 'myapp'; " in mine.stderr
    )
    assert "under namespace 'a:b~', 'other': add --namespace" in mine.stderr
    listed = uniqjob("locks", "--url", url, "--namespace", "a:b~", "--json")
    assert [json.loads(line)["key"] for line in listed.stdout.splitlines()] == ["}odd"]


def test_lock_row_json_renames_only_the_class_field() -> None:
    state = LockState("k", None, None, 0.0)
    row = LockRow.from_state(state)
    assert set(row.to_json()) == FIELDS
    assert row.to_json()["class"] is None


def test_release_a_missing_key_exits_1(store: Store) -> None:
    result = uniqjob("release", "--url", store.url, "no-such-key")
    assert result.returncode == 1
    assert result.stderr == "uniqjob: no lock on 'no-such-key'\n"


@pytest.mark.slow
def test_release_refuses_a_live_holder_unless_forced(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", store.url, "--key", "reports", "--lease", "1")
    hold.wait_running()
    refused = uniqjob("release", "--url", store.url, "reports")
    assert refused.returncode == 1
    assert "not releasing 'reports'" in refused.stderr and f"pid {wrapper.pid}" in refused.stderr
    assert "is alive" in refused.stderr and "--force" in refused.stderr
    assert not store.backend.read("reports").free
    assert wrapper.poll() is None

    forced = uniqjob("release", "--url", store.url, "--force", "reports")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("released reports (running, pid")
    assert finish(wrapper)[0] == 143  # its heartbeat saw the lock go and stopped the command
    assert store.backend.read("reports").free


@pytest.mark.parametrize("make", [queued, orphan], ids=["queued", "orphaned"])
@pytest.mark.slow
def test_release_needs_no_force_without_a_live_holder(make: object, store: Store) -> None:
    make(store, "k")  # type: ignore[operator]
    result = uniqjob("release", "--url", store.url, "k")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("released k (")
    assert store.backend.read("k").free


@pytest.mark.slow
def test_reap_reclaims_orphans_only(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", store.url, "--key", "live")
    hold.wait_running()
    queued(store, "waiting")
    orphan(store, "crashed-1")
    orphan(store, "crashed-2")
    # Another host's holder cannot be checked from here: only its lease can tell, and it is fresh.
    elsewhere = RunClaim(Holder("elsewhere", "other-node", 1, 1), lease=60)
    assert store.backend.claim("remote", "t-remote", meta=QueueMeta(), run=elsewhere) is None

    dry = uniqjob("reap", "--url", store.url, "--dry-run")
    assert dry.returncode == 0
    host = socket.gethostname()
    assert sorted(dry.stdout.splitlines()) == [
        f"would reclaim {key} (running, pid {_pid(store, key)} on {host}, orphaned)"
        for key in ("crashed-1", "crashed-2")
    ]
    assert dry.stderr == "would reclaim 2 orphaned lock(s) of 5 held\n"
    assert not store.backend.read("crashed-1").free

    reaped = uniqjob("reap", "--url", store.url)
    assert reaped.returncode == 0
    assert sorted(line.split(" (")[0] for line in reaped.stdout.splitlines()) == [
        "reclaimed crashed-1",
        "reclaimed crashed-2",
    ]
    assert reaped.stderr == "reclaimed 2 orphaned lock(s) of 5 held\n"
    assert store.backend.read("crashed-1").free and store.backend.read("crashed-2").free
    assert not store.backend.read("waiting").free and not store.backend.read("remote").free
    assert not store.backend.read("live").free and wrapper.poll() is None

    again = uniqjob("reap", "--url", store.url)
    assert (again.returncode, again.stdout) == (0, "")
    assert again.stderr == "reclaimed 0 orphaned lock(s) of 3 held\n"  # the count, also of nothing
    quiet = uniqjob("reap", "--url", store.url, "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")  # nothing reclaimed: nothing said
    hold.release()
    assert finish(wrapper)[0] == 0


def _pid(store: Store, key: str) -> int:
    run = store.backend.read(key).run
    assert run is not None
    return run.holder.pid


def test_run_names_a_queued_holder(store: Store) -> None:
    queued(store, "export-42")
    result = uniqjob("run", "--url", store.url, "--key", "export-42", "--", "true")
    assert result.returncode == 75
    assert "lock 'export-42' is held by a queued job, for" in result.stderr


def test_locks_into_a_closed_pipe_is_quiet(store: Store) -> None:
    queued(store, "export-42")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        argv = [*UNIQJOB, "locks", "--url", store.url]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as under cron
        result = subprocess.run(
            argv, stdout=write_end, stderr=subprocess.PIPE, env=env, text=True, timeout=30, check=False
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")
