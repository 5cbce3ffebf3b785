"""``uniqjob.ops``, called directly (not through the command line), on every store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import uniqjob
import uniqjob.concurrency
from uniqjob import ops
from uniqjob.concurrency import Park, store_for
from uniqjob.errors import CorruptRecordError
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim, local_holder
from uniqjob.ops import CORRUPT, LockRelease, LockRow, Released
from uniqjob.stores.base import Backend

ROOT = Path(__file__).resolve().parent.parent
ELSEWHERE = Holder("elsewhere", "other-node", 1, 1)  # another host: only its lease can tell


def dead_holder() -> Holder:
    """A holder on this host whose process has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 12345)


def orphan(backend: Backend, key: str) -> None:
    claim = RunClaim(dead_holder(), lease=60)
    assert backend.claim(key, "t-" + key, meta=QueueMeta("app.jobs.Crashed", "7"), run=claim) is None


def queued(backend: Backend, key: str) -> None:
    assert backend.claim(key, "t-" + key, meta=QueueMeta("app.jobs.Export", "42", "job-1"), ttl=600) is None


def running(backend: Backend, key: str, holder: Holder | None = None) -> None:
    claim = RunClaim(holder or local_holder(), lease=60)
    assert backend.claim(key, "t-" + key, meta=QueueMeta("app.jobs.Live"), run=claim) is None


def damaged(backend: Backend, key: str, monkeypatch: pytest.MonkeyPatch) -> CorruptRecordError:
    """Leave records on ``key`` that the store reads as corrupt (its other keys read as ever)."""
    orphan(backend, key)
    error = CorruptRecordError(f"records/{key}", "torn", key=key, backend=backend.name)
    read = backend.read

    def read_or_fail(name: str) -> LockState:
        if name == key:
            raise error
        return read(name)

    monkeypatch.setattr(backend, "read", read_or_fail)
    return error


# -- rows ---------------------------------------------------------------------------------


def test_iter_rows_describes_each_held_key(backend: Backend) -> None:
    assert list(ops.iter_rows(backend)) == []
    queued(backend, "export")
    orphan(backend, "crashed")
    running(backend, "live")
    rows = {row.key: row for row in ops.iter_rows(backend)}
    assert set(rows) == {"export", "crashed", "live"}
    assert (rows["export"].state, rows["export"].job_class, rows["export"].args) == (
        "queued",
        "app.jobs.Export",
        "42",
    )
    assert rows["export"].host is None and 0 < (rows["export"].ttl_s or 0) <= 600
    assert (rows["export"].job_id, rows["live"].job_id) == ("job-1", None)
    assert rows["crashed"].orphaned and not rows["live"].orphaned and not rows["export"].orphaned
    assert (rows["live"].host, rows["live"].pid) == (local_holder().host, local_holder().pid)
    assert [r.key for r in ops.iter_rows(backend, job_class="Export")] == ["export"]
    assert [r.key for r in ops.iter_rows(backend, job_class="app.jobs.Live")] == ["live"]
    assert list(ops.iter_rows(backend, job_class="Nope")) == []


def test_iter_rows_defaults_to_the_configured_store(backend: Backend) -> None:
    uniqjob.configure(backend)
    queued(backend, "export")
    assert [r.key for r in ops.iter_rows()] == ["export"]


def test_a_corrupt_record_is_a_row_whatever_the_class(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued(backend, "good")
    error = damaged(backend, "broken", monkeypatch)
    rows = list(ops.iter_rows(backend, job_class="Export"))
    assert {r.key: r.state for r in rows} == {"good": "queued", "broken": CORRUPT}
    (bad,) = (r for r in rows if r.state == CORRUPT)
    assert (bad.path, bad.reason, bad.age_s) == (error.path, "torn", None)


# -- reap ---------------------------------------------------------------------------------


def test_reap_reclaims_orphans_only(backend: Backend) -> None:
    queued(backend, "waiting")
    orphan(backend, "crashed-1")
    orphan(backend, "crashed-2")
    running(backend, "live")
    running(backend, "remote", ELSEWHERE)

    seen: list[LockRow] = []
    dry = ops.reap(backend, dry_run=True, each=seen.append)
    assert sorted(r.key or "" for r in dry.reclaimed) == ["crashed-1", "crashed-2"]
    assert (dry.held, dry.corrupt, seen) == (5, [], dry.reclaimed)
    assert not backend.read("crashed-1").free  # a dry run changes nothing

    done = ops.reap(backend)
    assert sorted(r.key or "" for r in done.reclaimed) == ["crashed-1", "crashed-2"]
    assert all(r.orphaned and r.state == "running" for r in done.reclaimed)
    assert backend.read("crashed-1").free and backend.read("crashed-2").free
    assert not any(backend.read(k).free for k in ("waiting", "live", "remote"))
    assert ops.reap(backend) == ops.Reaped([], 3, [])


def test_reap_skips_a_corrupt_record_and_reaps_the_rest(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    orphan(backend, "crashed")
    damaged(backend, "broken", monkeypatch)
    seen: list[LockRow] = []
    done = ops.reap(backend, each=seen.append)
    assert [r.key for r in done.reclaimed] == ["crashed"] and done.held == 1
    assert [(r.key, r.state) for r in done.corrupt] == [("broken", CORRUPT)]
    assert sorted(r.key or "" for r in seen) == ["broken", "crashed"]  # each one as it was found
    assert backend.read("crashed").free


def test_reap_uses_the_one_orphan_rule(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    orphan(backend, "crashed")
    queued(backend, "waiting")
    monkeypatch.setattr("uniqjob.ops._locks.orphaned", lambda state, me=None: state.key == "waiting")
    assert [r.key for r in ops.reap(backend).reclaimed] == ["waiting"]
    assert backend.read("waiting").free and not backend.read("crashed").free


# -- release --------------------------------------------------------------------------------


def test_release_of_nothing_is_none(backend: Backend) -> None:
    assert ops.release("nothing-here", backend) is None
    assert ops.release("nothing-here", backend, force=True) is None


@pytest.mark.parametrize("make", [queued, orphan], ids=["queued", "orphaned"])
def test_release_needs_no_force_without_a_live_holder(make: object, backend: Backend) -> None:
    make(backend, "k")  # type: ignore[operator]
    done = ops.release("k", backend)
    assert isinstance(done, LockRelease) and (done.done, done.ok, done.row.key) == ("released", True, "k")
    assert backend.read("k").free


@pytest.mark.parametrize("holder", [None, ELSEWHERE], ids=["here", "elsewhere"])
def test_release_refuses_a_live_holder_unless_forced(holder: Holder | None, backend: Backend) -> None:
    running(backend, "reports", holder)
    refused = ops.release("reports", backend)
    assert isinstance(refused, LockRelease) and (refused.done, refused.ok) == ("alive", False)
    assert refused.row.pid == (holder or local_holder()).pid and 0 < (refused.row.lease_s or 0) <= 60
    assert not backend.read("reports").free
    forced = ops.release("reports", backend, force=True)
    assert isinstance(forced, LockRelease) and forced.done == "released"
    assert backend.read("reports").free


def test_release_of_a_corrupt_record_needs_force(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    error = damaged(backend, "broken", monkeypatch)
    refused = ops.release("broken", backend)
    assert isinstance(refused, LockRelease) and (refused.done, refused.removed) == ("corrupt", ())
    assert (refused.row.key, refused.row.path, refused.row.reason) == ("broken", error.path, "torn")
    forced = ops.release("broken", backend, force=True)
    assert isinstance(forced, LockRelease) and forced.done == "purged" and forced.ok
    assert forced.removed  # the store's own names of what went
    monkeypatch.undo()
    assert backend.read("broken").free
    assert ops.release("broken", backend, force=True) is None


def test_release_of_a_corrupt_record_says_what_the_store_cannot_do(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged(backend, "broken", monkeypatch)

    def cannot(key: str) -> list[str]:
        raise NotImplementedError

    monkeypatch.setattr(backend, "purge", cannot)
    done = ops.release("broken", backend, force=True)
    assert isinstance(done, LockRelease) and done.done == "unsupported"
    monkeypatch.setattr(backend, "purge", lambda key: [])
    done = ops.release("broken", backend, force=True)
    assert isinstance(done, LockRelease) and done.done == "gone"


def test_release_takes_the_path_of_a_record_that_names_no_key(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = CorruptRecordError("records/lost", "not valid JSON", backend=backend.name)
    monkeypatch.setattr(backend, "corrupt", lambda: iter([lost]))
    assert [(r.key, r.path) for r in ops.iter_rows(backend)] == [(None, "records/lost")]
    refused = ops.release("records/lost", backend)
    assert isinstance(refused, LockRelease) and refused.done == "corrupt" and refused.row.key is None
    purged: list[str] = []

    def purge(target: str) -> list[str]:
        purged.append(target)
        return [target]

    monkeypatch.setattr(backend, "purge", purge)
    done = ops.release("records/lost", backend, force=True)
    assert isinstance(done, LockRelease) and (done.done, done.removed) == ("purged", ("records/lost",))
    assert purged == ["records/lost"]


# -- concurrency keys -------------------------------------------------------------------------


def hold_slot(backend: Backend, key: str, token: str, holder: Holder, *, limit: int = 2) -> None:
    outcome = store_for(backend).acquire(
        key, token, limit=limit, lease=600, running=True, holder=holder, park=None,
        job_class="app.jobs.Limited", args="", caller=holder,
    )  # fmt: skip
    assert outcome.status == "taken"


def park_inline(backend: Backend, key: str, token: str, *, limit: int = 2) -> None:
    outcome = store_for(backend).acquire(
        key, token, limit=limit, lease=600, running=False, holder=None, park=Park("inline", ""),
        job_class="app.jobs.Limited", args="", caller=local_holder(),
    )  # fmt: skip
    assert outcome.status == "parked"


def park_queued(backend: Backend, key: str, token: str, lock: str, *, hold: bool = False) -> None:
    if hold:
        hold_slot(backend, key, "holder-" + token, local_holder(), limit=1)
    outcome = store_for(backend).acquire(
        key, token, limit=1, lease=600, running=False, holder=None,
        park=Park("queue", json.dumps({"lock": lock})), job_class="app.jobs.Limited", args="",
        caller=local_holder(),
    )  # fmt: skip
    assert outcome.status == "parked"


def test_figures_count_stale_slots_and_parked_jobs(backend: Backend) -> None:
    hold_slot(backend, "busy", "dead", dead_holder())
    hold_slot(backend, "busy", "live", local_holder())
    park_inline(backend, "busy", "waiting")
    hold_slot(backend, "calm", "live2", ELSEWHERE)
    report = ops.concurrency(backend, top=1)
    (busy,) = report.keys
    assert (busy.key, busy.held, busy.stale, busy.fresh, busy.parked, busy.lease) == (
        "busy",
        2,
        1,
        1,
        1,
        "mixed",
    )
    assert busy.at_limit and report.left_out == 1
    assert report.totals == ops.Totals(2, 3, 1, 1, 1, busy.oldest_wait)
    assert sorted(k.key for k in ops.iter_keys(backend, job_class="Limited")) == ["busy", "calm"]
    assert list(ops.iter_keys(backend, job_class="Nope")) == []
    calm = ops.concurrency_key("calm", backend)
    assert calm is not None and (calm.held, calm.stale, calm.lease) == (1, 0, "fresh")
    assert ops.concurrency_key("nobody", backend) is None
    assert ops.concurrency(backend, job_class="Nope").totals.keys == 0


def test_release_slots_frees_stale_slots_and_keeps_fresh_ones(backend: Backend) -> None:
    hold_slot(backend, "k", "dead", dead_holder())
    hold_slot(backend, "k", "live", local_holder())
    done = ops.release("k", backend)  # a concurrency key: its slots
    assert isinstance(done, Released)
    assert (done.released, done.kept, done.forced, done.limit) == (1, 1, 0, 2)
    assert [s.token for s in done.fresh] == ["live"]
    forced = ops.release_slots("k", backend, force=True)
    assert forced is not None and (forced.released, forced.kept, forced.forced) == (1, 0, 1)
    assert ops.release_slots("k", backend) is None  # nothing left
    assert store_for(backend).read("k").empty


def test_sweep_reclaims_dead_holders_slots(backend: Backend) -> None:
    hold_slot(backend, "k", "dead", dead_holder())
    hold_slot(backend, "k", "remote", ELSEWHERE)
    assert ops.sweep(backend) == 1
    assert ops.sweep(backend) == 0
    assert [s.token for s in store_for(backend).read("k").slots] == ["remote"]


def test_discard_parked_drops_one_keys_line_and_its_locks(backend: Backend) -> None:
    hold_slot(backend, "k", "live", local_holder(), limit=1)
    for n in (1, 2):
        assert backend.claim(f"lock-{n}", f"w{n}", meta=QueueMeta("app.jobs.Limited")) is None
        park_queued(backend, "k", f"w{n}", f"lock-{n}")
    park_queued(backend, "other", "w3", "lock-3", hold=True)
    assert ops.discard_parked("k", backend) == 2
    assert backend.read("lock-1").free and backend.read("lock-2").free  # their uniqueness locks went too
    assert ops.discard_parked("k", backend) == 0
    state = store_for(backend).read("k")
    assert state.parked == 0 and [s.token for s in state.slots] == ["live"]
    assert store_for(backend).read("other").parked == 1  # one key's line only


def test_the_concurrency_package_re_exports_the_same_operations() -> None:
    assert uniqjob.concurrency.release_slots is ops.release_slots
    assert uniqjob.concurrency.discard_parked is ops.discard_parked
    assert uniqjob.concurrency.sweep is ops.sweep
    assert uniqjob.concurrency.Released is ops.Released


# -- the submodule ----------------------------------------------------------------------------------


def _run(script: str) -> object:
    """Run ``script`` in a fresh interpreter; return what it printed as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_uniqjob_ops_is_reached_from_a_plain_import() -> None:
    assert _run("import json, uniqjob; print(json.dumps(uniqjob.ops.__name__))") == "uniqjob.ops"
