"""Review of issue 24's coalescing (keep_last, replace, debounce): interleavings that break a promise.

Each test is a bug the review found (each was first committed as a strict xfail), fixed since: they
stay as regression tests. A worker is played in this process by :class:`Jobs`, a queue that
keeps what is pushed, and :func:`work`, which runs it as the integrations do
(``lock_from(key, token)``, then ``execute``); the stores are the real ones, on an injected clock
where time must pass.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import uniqjob
from tests.conftest import STORES, FakeClock, store_url
from tests.integration_workers import REPO
from uniqjob import Pending, Queue, UniqueJob
from uniqjob.errors import BackendError
from uniqjob.joblock import JobLock
from uniqjob.locks import PendingCall, RunClaim, local_holder
from uniqjob.stores.base import Backend


@dataclass
class Pushed:
    cls: type[UniqueJob]
    key: str
    token: str
    job_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Jobs(Queue):
    """A queue in this process: it names its jobs before the claim, delays and removes them."""

    suspect_after = 60.0

    def __init__(self) -> None:
        self.jobs: list[Pushed] = []
        self.removed: list[str] = []
        self._ids = iter(range(1, 1_000_000))

    def new_job_id(self) -> str:
        return f"job-{next(self._ids)}"

    def push(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any) -> str:
        self.jobs.append(Pushed(job_cls, lock.key, lock.token, lock.meta.job_id, tuple(args), dict(kwargs)))
        return lock.meta.job_id

    def push_in(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any, delay: float) -> str:
        return self.push(job_cls, lock, args, kwargs)

    def handle(self, job_id: str) -> str:
        return job_id

    def remove(self, job_id: str) -> None:
        self.removed.append(job_id)
        self.jobs = [job for job in self.jobs if job.job_id != job_id]


jobs = Jobs()


def work() -> None:
    """Run every job in the queue, in order, as a worker does (jobs pushed meanwhile run too)."""
    while jobs.jobs:
        job = jobs.jobs.pop(0)
        job.cls.execute(job.cls.lock_from(job.key, job.token), job.args, job.kwargs)


class Latest(UniqueJob):
    """keep_last on a queue, with an autoexpire (what uniqjob recommends on a queue that cannot
    prove a job gone, such as Celery's) and a lease longer than it."""

    unique_queue = jobs
    unique_on_conflict = "keep_last"
    unique_args = ("name",)
    unique_lock_autoexpire = 60
    unique_run_lease = 600
    runs: ClassVar[list[int]] = []
    during: ClassVar[Callable[[], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)
        if Latest.during is not None:
            Latest.during()


class Swap(UniqueJob):
    """replace on a queue; ``run()`` too performs it inline (scripts and cron)."""

    unique_queue = jobs
    unique_on_conflict = "replace"
    unique_args = ("name",)
    runs: ClassVar[list[int]] = []
    running: ClassVar[int] = 0
    overlapped: ClassVar[bool] = False
    during: ClassVar[Callable[[], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        Swap.running += 1
        Swap.overlapped |= Swap.running > 1
        try:
            self.runs.append(version)
            if Swap.during is not None:
                during, Swap.during = Swap.during, None
                during()
        finally:
            Swap.running -= 1


class Inline(UniqueJob):
    """keep_last with no queue: a call while one runs waits, and runs in the holder's process."""

    unique_on_conflict = "keep_last"
    unique_args = ("name",)
    runs: ClassVar[list[int]] = []
    during: ClassVar[Callable[[], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)
        if Inline.during is not None:
            during, Inline.during = Inline.during, None
            during()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    jobs.jobs.clear()
    jobs.removed.clear()
    for cls in (Latest, Swap, Inline, Debounced):
        cls.runs.clear()
        cls.during = None
    Swap.running, Swap.overlapped = 0, False
    yield


@pytest.fixture(params=["memory", "file"])
def timed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Backend, FakeClock]:
    """A store on a clock the test moves (no sleeping), configured as the default."""
    clock = FakeClock()
    store = STORES[request.param].make(request, tmp_path, clock)
    uniqjob.configure(store)
    return store, clock


@pytest.fixture(params=["memory", "file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The record machine (memory, file) and the Lua scripts, configured as the default."""
    made = STORES[request.param].make(request, tmp_path, FakeClock())
    uniqjob.configure(made)
    return made


# -- autoexpire: a coalescing job's start refuses a queue lock that is no longer there -----------


def test_a_keep_last_job_that_waited_past_its_autoexpire_still_runs(timed: tuple[Backend, FakeClock]) -> None:
    store, clock = timed
    assert Latest.enqueue("a", 1)
    clock.advance(61)  # a busy queue: the job waited longer than the lock's autoexpire
    assert store.read(Latest.lock_key("a", 0)).free  # nobody holds the key
    work()
    assert Latest.runs == [1]


def test_a_pending_call_survives_the_autoexpire_of_the_running_lock(timed: tuple[Backend, FakeClock]) -> None:
    _, clock = timed
    Latest.enqueue("b", 1)

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("b", 2), Pending)
        clock.advance(61)  # the run is long (its lease is 600 s): the queue lock autoexpires under it

    Latest.during = meanwhile
    work()
    assert Latest.runs == [1, 2]


class InlineExpiring(UniqueJob):
    """keep_last with no queue and an autoexpire shorter than its runs."""

    unique_on_conflict = "keep_last"
    unique_args = ("name",)
    unique_lock_autoexpire = 60
    unique_run_lease = 600
    runs: ClassVar[list[int]] = []
    during: ClassVar[Callable[[int], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)
        if InlineExpiring.during is not None:
            InlineExpiring.during(version)


def test_an_inline_pending_call_survives_the_autoexpire_of_the_running_lock(
    timed: tuple[Backend, FakeClock],
) -> None:
    _, clock = timed
    InlineExpiring.runs.clear()

    def meanwhile(version: int) -> None:
        if version < 3:  # each run is long, and a call comes while it runs
            assert isinstance(InlineExpiring.enqueue("i", version + 1), Pending)
            clock.advance(61)

    InlineExpiring.during = meanwhile
    try:
        InlineExpiring.run("i", 1)
    finally:
        InlineExpiring.during = None
    assert InlineExpiring.runs == [1, 2, 3]


def test_a_coalescing_start_takes_an_expired_lock_and_keeps_its_lock_for_its_run(store: Backend) -> None:
    from uniqjob.locks import QueueMeta

    meta = QueueMeta("tests.Job")

    def start(key: str, token: str, ttl: float | None) -> Any:
        run = RunClaim(local_holder(), 600.0, "")
        return store.start(key, token, run=run, meta=meta, ttl=ttl, queue_lock="own")

    assert start("expired", "t1", 60.0) is None  # its lock autoexpired while it waited: it runs
    assert start("gone", "t1", None) is not None  # no autoexpire: replaced, or run already
    assert store.claim("k", "t2", meta=meta, ttl=60.0) is None
    assert start("k", "t2", 60.0) is None
    queue = store.read("k").queue
    assert queue is not None and queue.ttl is None  # held as long as its run, not its autoexpire


# -- replace, inline: the claim that replaces takes no run lock ----------------------------------


def test_inline_replace_of_a_queued_job_never_runs_two_at_once(store: Backend) -> None:
    Swap.enqueue("r", 1)  # a job waits in its queue
    Swap.during = lambda: Swap.run("r", 3)  # another script runs the job while this one runs it
    Swap.run("r", 2)
    assert not Swap.overlapped, Swap.runs


# -- a lost reply to FINISH: the pending call it queued is never pushed ---------------------------


def test_a_lost_reply_to_the_release_never_mutes_an_inline_keep_last_key(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = store.finish

    def applied_then_lost(key: str, token: str, **options: Any) -> PendingCall | None:
        real(key, token, **options)  # applied on the store; the reply never arrives
        raise BackendError("connection lost while reading the reply", store.name)

    def meanwhile() -> None:
        assert isinstance(Inline.enqueue("l", 2), Pending)
        monkeypatch.setattr(store, "finish", applied_then_lost)  # the holder's release

    Inline.during = meanwhile
    Inline.run("l", 1)
    monkeypatch.setattr(store, "finish", real)  # the store answers again
    from uniqjob._undo import undos

    undos.flush()  # the undo thread's next round (it retries about twice a second)
    Inline.run("l", 3)  # a later trigger, any time later
    assert Inline.runs[-1] == 3, Inline.runs


def test_finish_retried_after_a_lost_reply_returns_the_pending_call_again(store: Backend) -> None:
    lock = Inline.lock("m", 1)
    assert lock.acquire(run=True)
    assert isinstance(Inline.enqueue("m", 2), Pending)
    first = store.finish(lock.key, lock.token)
    assert first is not None
    again = store.finish(lock.key, lock.token)  # the first reply was lost: the same step, again
    assert again is not None and again.token == first.token


# -- reap: a dead inline holder's pending call ------------------------------------------------------


def test_reap_of_an_inline_orphan_with_a_pending_call_leaves_its_key_usable(
    timed: tuple[Backend, FakeClock],
) -> None:
    store, clock = timed
    holder = Inline.lock("k", 1)  # an inline run in a process that dies
    assert holder.acquire(run=True)
    assert isinstance(Inline.enqueue("k", 2), Pending)  # waits behind it
    clock.advance(Inline.unique_run_lease + 1)  # the holder's lease lapsed: an orphan
    reaped = uniqjob.ops.reap(store)
    assert [row.key for row in reaped.reclaimed] == [holder.key]
    Inline.run("k", 3)  # the next trigger
    assert Inline.runs == [3]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "redis"])
def test_reap_after_a_killed_inline_holder_with_a_pending_call(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    request.param = kind  # store_url reads the kind from request.param
    url = store_url(request, tmp_path)
    uniqjob.configure(url)
    ready = tmp_path / "ready"
    code = (
        "import sys, time, uniqjob\n"
        "uniqjob.configure(sys.argv[1])\n"
        "from tests.test_review_coalesce import Inline\n"
        "assert Inline.lock('p', 1).acquire(run=True)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, url, str(ready)], cwd=REPO)
    try:
        from tests.test_cli import wait_for

        wait_for(ready.exists, timeout=20, what="the holder to take the key")
        assert isinstance(Inline.enqueue("p", 2), Pending)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    reap = subprocess.run(
        [sys.executable, "-m", "uniqjob", "reap", "--url", url],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert reap.returncode == 0, reap.stderr
    Inline.run("p", 3)
    assert Inline.runs == [3]


# -- reap racing a redelivery of the orphan's own job ----------------------------------------------


def test_reap_never_robs_a_redelivery_that_took_the_orphan_back(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = timed
    Latest.enqueue("d", 1)
    (job,) = jobs.jobs
    first = RunClaim(local_holder(), Latest.unique_run_lease, "attempt-1")
    meta = Latest.lock_from(job.key, job.token).meta
    assert store.start(job.key, job.token, run=first, meta=meta, queue_lock="own") is None  # a worker runs it
    assert isinstance(Latest.enqueue("d", 2), Pending)
    clock.advance(Latest.unique_run_lease + 1)  # the worker died (elsewhere: only its lease tells)
    again = RunClaim(local_holder(), Latest.unique_run_lease, "attempt-2")
    real = store.finish

    def redelivered_first(key: str, token: str, **options: Any) -> PendingCall | None:
        # the broker redelivers the job; its start lands between reap's read and reap's finish
        assert store.start(job.key, job.token, run=again, meta=meta, queue_lock="own") is None
        monkeypatch.setattr(store, "finish", real)
        return real(key, token, **options)

    monkeypatch.setattr(store, "finish", redelivered_first)
    uniqjob.ops.reap(store)
    run = store.read(job.key).run
    assert run is not None and run.token == job.token  # the live redelivery still holds its run lock


# -- debounce: a start refused for another reason than "not yet due" -------------------------------


class Debounced(UniqueJob):
    unique_queue = jobs
    unique_debounce = 5.0
    unique_args = ("name",)
    runs: ClassVar[list[int]] = []
    during: ClassVar[Callable[[], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)
        if Debounced.during is not None:
            during, Debounced.during = Debounced.during, None
            during()


def test_a_second_delivery_of_a_running_debounced_job_is_skipped_not_pushed_again(
    timed: tuple[Backend, FakeClock],
) -> None:
    _, clock = timed
    Debounced.enqueue("s", 1)
    clock.advance(6)  # due
    (job,) = jobs.jobs
    pushed: list[int] = []

    def redelivered() -> None:  # the broker delivers the running job again (another worker)
        Debounced.execute(Debounced.lock_from(job.key, job.token), job.args, job.kwargs)
        pushed.append(len(jobs.jobs))

    Debounced.during = redelivered
    work()
    assert Debounced.runs == [1] and pushed == [0]  # skipped: nothing pushed again


# -- the arguments kept as JSON ---------------------------------------------------------------------


class Keyed(UniqueJob):
    """keep_last, inline, with a dict argument."""

    unique_on_conflict = "keep_last"
    unique_args = ("name",)
    runs: ClassVar[list[Any]] = []

    def perform(self, name: str, data: Any) -> None:
        self.runs.append(data)
        if len(self.runs) == 1:
            assert isinstance(Keyed.enqueue(name, {2: "b", True: (1, 2)}), Pending)


def test_keep_last_runs_the_pending_call_with_the_arguments_passed_or_refuses_them(store: Backend) -> None:
    Keyed.runs.clear()
    try:
        Keyed.run("j", {1: "a"})
    except uniqjob.ConfigurationError:
        return  # refused, as documented: fine
    assert Keyed.runs[-1] == {2: "b", True: (1, 2)}, Keyed.runs


@pytest.mark.parametrize("data", [(1, 2), {"a": [{1: "b"}]}])
def test_arguments_json_would_change_are_refused_by_name(store: Backend, data: Any) -> None:
    def meanwhile() -> None:
        with pytest.raises(uniqjob.ConfigurationError, match=r"change argument version .*lists and dicts"):
            Inline.enqueue("t", version=data)

    Inline.during = meanwhile
    Inline.run("t", 1)
    assert Inline.runs == [1]


# -- a coalescing claim whose reply was lost, then undone ---------------------------------------------


def lose_one_reply(store: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's next claim is applied, and its reply lost (BackendError, as a timeout mid-reply)."""
    real = store.claim

    def applied_then_lost(key: str, token: str, **options: Any) -> Any:
        monkeypatch.setattr(store, "claim", real)
        real(key, token, **options)
        raise BackendError("connection lost while reading the reply", store.name)

    monkeypatch.setattr(store, "claim", applied_then_lost)


def test_a_replace_whose_reply_was_lost_never_loses_the_queued_call(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uniqjob._undo import undos

    Swap.enqueue("u", 1)  # succeeded: its job waits in the queue
    lose_one_reply(store, monkeypatch)
    with pytest.raises(BackendError):
        Swap.enqueue("u", 2)  # failed, as far as its caller knows
    undos.flush()
    work()
    assert Swap.runs == [1]


def test_a_pending_call_whose_reply_was_lost_never_loses_the_earlier_pending_call(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uniqjob._undo import undos

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("v", 2), Pending)  # succeeded: runs after this one
        lose_one_reply(store, monkeypatch)
        with pytest.raises(BackendError):
            Latest.enqueue("v", 3)  # applied (it is the pending call now), its caller told it failed

    Latest.enqueue("v", 1)
    Latest.during = meanwhile
    (job,) = jobs.jobs
    jobs.jobs.clear()
    job.cls.execute(job.cls.lock_from(job.key, job.token), job.args, job.kwargs)  # pushes the pending call
    undos.flush()  # within SETTLE of the lost reply
    work()
    assert Latest.runs[0] == 1 and Latest.runs[1:] in ([2], [3]), Latest.runs


def test_a_keep_last_job_refused_by_a_run_that_outlived_its_queue_lock_runs_later(
    timed: tuple[Backend, FakeClock],
) -> None:
    _, clock = timed
    Latest.enqueue("w", 1)

    def meanwhile() -> None:
        Latest.during = None
        clock.advance(61)  # the run goes on past its queue lock's autoexpire (its lease is 600 s)
        Latest.enqueue("w", 2)  # the last trigger: pending now (the running lock outlives its autoexpire)
        while jobs.jobs:  # a job of its own, were it given one: worker 2 runs it at once
            later = jobs.jobs.pop()
            later.cls.execute(later.cls.lock_from(later.key, later.token), later.args, later.kwargs)

    (job,) = jobs.jobs
    jobs.jobs.clear()
    Latest.during = meanwhile
    job.cls.execute(job.cls.lock_from(job.key, job.token), job.args, job.kwargs)
    work()
    assert Latest.runs == [1, 2]


def test_a_failed_start_of_an_inline_pending_call_never_mutes_the_key(
    store: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = store.start

    def unreachable_once(key: str, token: str, **options: Any) -> Any:
        monkeypatch.setattr(store, "start", real)
        raise BackendError("connection refused", store.name)

    def meanwhile() -> None:
        assert isinstance(Inline.enqueue("f", 2), Pending)
        monkeypatch.setattr(store, "start", unreachable_once)  # when the pending call starts

    Inline.during = meanwhile
    with contextlib.suppress(BackendError):  # said to the caller: fine
        Inline.run("f", 1)
    Inline.run("f", 3)  # the store answers again; a later trigger
    assert Inline.runs[-1] == 3, Inline.runs
