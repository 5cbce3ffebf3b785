"""Review of a session's changes (a failed release made again in the background, a keep_last call
handed on by a revoke or a raise): interleavings that broke a promise. Each was a failing test of
the review, fixed since: they stay as regression tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import uniqjob
from tests.conftest import STORES, FakeClock
from tests.test_review_coalesce import Inline, Latest, jobs, work
from uniqjob import Pending, UniqueJob
from uniqjob._undo import undos
from uniqjob.errors import BackendError
from uniqjob.locks import PendingCall
from uniqjob.stores.base import Backend


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    jobs.jobs.clear()
    jobs.removed.clear()
    for cls in (Latest, Inline):
        cls.runs.clear()
        cls.during = None
    yield


@pytest.fixture(params=["memory", "file"])
def timed(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[Backend, FakeClock]:
    clock = FakeClock()
    store = STORES[request.param].make(request, tmp_path, clock)
    uniqjob.configure(store)
    return store, clock


class _Alive:
    """Stands in for the undo thread: the test makes its rounds itself (undos.flush())."""

    def is_alive(self) -> bool:
        return True


@pytest.fixture
def no_undo_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(undos, "_thread", _Alive())


def test_an_inline_keep_last_run_that_raises_leaves_its_key_usable(timed: tuple[Backend, FakeClock]) -> None:
    def meanwhile() -> None:
        assert isinstance(Inline.enqueue("x", 2), Pending)
        raise RuntimeError("perform failed")

    Inline.during = meanwhile
    with pytest.raises(RuntimeError):
        Inline.run("x", 1)
    Inline.run("x", 3)  # a later trigger
    assert Inline.runs[-1] == 3, Inline.runs


def test_a_queue_keep_last_job_that_raises_still_hands_on_its_pending_call(
    timed: tuple[Backend, FakeClock],
) -> None:
    # A worker that executes without a settle (work(): lock_from, then execute).
    Latest.enqueue("q", 1)

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("q", 2), Pending)
        raise RuntimeError("perform failed")

    Latest.during = meanwhile
    with pytest.raises(RuntimeError):
        work()
    work()
    assert Latest.runs == [1, 2]


def _release_fails(store: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next FINISH fails with the store away (not applied); later ones reach the store."""
    real = store.finish

    def away(key: str, token: str, **options: Any) -> PendingCall | None:
        monkeypatch.setattr(store, "finish", real)
        raise BackendError("connection refused", store.name)

    monkeypatch.setattr(store, "finish", away)


def test_the_retried_release_and_reap_push_the_pending_call_once(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    store, clock = timed
    Latest.enqueue("p", 1)

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("p", 2), Pending)  # waits behind the run
        _release_fails(store, monkeypatch)  # the worker is cut off from the store as the run ends

    Latest.during = meanwhile
    work()  # its release failed: a delivery's locks lapse with their lease
    assert jobs.jobs == []
    clock.advance(Latest.unique_run_lease + 1)  # cut off longer than its lease: an orphan to the others
    uniqjob.ops.reap(store)  # elsewhere: pushes the pending call, as the holder would have
    assert len(jobs.jobs) == 1
    undos.flush()  # the worker reaches the store again: its release's retry
    pushed = [(job.token, job.job_id) for job in jobs.jobs]
    work()
    assert Latest.runs == [1, 2], pushed  # each call runs once


@pytest.fixture(params=["memory", "file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    made = STORES[request.param].make(request, tmp_path, FakeClock())
    uniqjob.configure(made)
    return made


def test_the_retried_release_and_a_forced_release_push_the_pending_call_once(
    store: Backend, monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    # The same as with reap, on every store (Redis: FINISH's 'b' field), through `uniqjob release
    # --force KEY`, what an operator does for a key whose holder cannot be reached.
    Latest.enqueue("f", 1)

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("f", 2), Pending)
        _release_fails(store, monkeypatch)

    Latest.during = meanwhile
    work()
    (key,) = [row.key for row in uniqjob.ops.iter_rows(store) if row.key is not None]
    uniqjob.ops.release(key, store, force=True)  # pushes the pending call
    undos.flush()  # the worker reaches the store again
    pushed = [(job.token, job.job_id) for job in jobs.jobs]
    work()
    assert Latest.runs == [1, 2], pushed


def test_a_redelivery_s_pending_call_is_not_pushed_again_by_the_first_delivery_s_retried_release(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    store, clock = timed
    Latest.enqueue("d", 1)
    (job,) = jobs.jobs

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("d", 2), Pending)
        _release_fails(store, monkeypatch)  # delivery 1 is cut off from the store (and its broker)

    Latest.during = meanwhile
    work()
    clock.advance(Latest.unique_run_lease + 1)  # its lease lapses; the broker delivers the job again
    Latest.execute(Latest.lock_from(job.key, job.token), job.args, job.kwargs)  # it pushes the call
    assert len(jobs.jobs) == 1
    undos.flush()  # delivery 1 reaches the store again: its release's retry (another attempt)
    pushed = [(j.token, j.job_id) for j in jobs.jobs]
    work()
    assert Latest.runs == [1, 1, 2], pushed  # the job twice (redelivered), its pending call once


def test_a_retried_worker_release_never_robs_a_live_redelivery_of_its_job(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    # The undo's tokens (keep_last) make this process's next claim of the key reclaim them
    # (_reclaim_ours): a worker's token is its job's, shared with a redelivery.
    store, clock = timed
    Latest.enqueue("v", 1)
    (job,) = jobs.jobs
    Latest.during = lambda: _release_fails(store, monkeypatch)
    work()  # delivery 1's release failed; its retry waits for the undo thread's next round
    clock.advance(Latest.unique_run_lease + 1)
    seen: list[Any] = []

    def while_redelivered() -> None:  # this worker (another thread, or any claim in this process)
        Latest.during = None
        seen.append(Latest.enqueue("v", 2))
        run = store.read(job.key).run
        seen.append(run.token if run is not None else None)

    Latest.during = while_redelivered
    Latest.execute(Latest.lock_from(job.key, job.token), job.args, job.kwargs)  # delivery 2 runs
    assert isinstance(seen[0], Pending) and seen[1] == job.token, seen  # delivery 2 kept its key


def test_an_inline_call_that_waited_is_not_dropped_by_the_undo_between_its_claim_and_its_reclaim(
    store: Backend, monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    Inline.during = lambda: _release_fails(store, monkeypatch)
    Inline.run("u", 1)  # its release failed (not applied): the key stays held by this process's run
    real = store.reclaim

    def undo_thread_first(key: str, queue_token: str | None, run_token: str | None) -> bool:
        # The undo thread's round lands between the next call's claim (coalesced as the pending
        # call behind the old run) and that call's reclaim of the old run's tokens (_reclaim_ours).
        monkeypatch.setattr(store, "reclaim", real)
        undos.flush()
        return real(key, queue_token, run_token)

    monkeypatch.setattr(store, "reclaim", undo_thread_first)
    result = Inline.run("u", 2)
    assert Inline.runs == [1, 2], (Inline.runs, result, store.read(Inline.lock_key("u", 0)).describe())


class Plain(UniqueJob):
    """until_executed, policy "log", on the in-process queue."""

    unique_queue = jobs
    unique_args = ("name",)
    unique_run_lease = 600
    runs: ClassVar[list[int]] = []

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)


def test_a_retried_release_leaves_the_queued_lock_of_its_job_s_retry(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    store, clock = timed
    Plain.enqueue("w", 1)
    (job,) = jobs.jobs
    _release_fails(store, monkeypatch)
    work()  # delivery 1 ran; its release failed
    clock.advance(Plain.unique_run_lease + 1)
    again = Plain.lock_from(job.key, job.token)  # the broker delivers the job again...
    again.start()
    assert again.requeue(delay=300)  # ...it fails, and waits 5 minutes for its retry, holding the key
    undos.flush()  # delivery 1 reaches the store again: its release's retry
    assert Plain.enqueue("w", 2) is None  # a duplicate while the job's retry waits: dropped


def test_a_revoke_that_races_the_task_s_own_end_pushes_its_pending_call_once(
    timed: tuple[Backend, FakeClock],
) -> None:
    # celery._on_revoked (and dramatiq's after_ack for a message dropped before it ran) does:
    # lock = ticket.lock(job); lock.release(); _job_sync.next_call(job, lock, lock.backend).
    # revoke(terminate=True) reaches the worker just as the task ended on its own in its child:
    # the child's release queued the pending call and pushed it.
    from uniqjob import _job_sync

    Latest.enqueue("c", 1)
    (job,) = jobs.jobs

    def meanwhile() -> None:
        Latest.during = None
        assert isinstance(Latest.enqueue("c", 2), Pending)

    Latest.during = meanwhile
    jobs.jobs.clear()
    Latest.execute(Latest.lock_from(job.key, job.token), job.args, job.kwargs)  # the child
    assert len(jobs.jobs) == 1  # its pending call, pushed by the child
    lock = Latest.lock_from(job.key, job.token)  # the worker's main process, on task_revoked
    lock.release()
    _job_sync.next_call(Latest, lock, lock.backend)
    pushed = [(j.token, j.job_id) for j in jobs.jobs]
    work()
    assert Latest.runs == [1, 2], pushed


def test_a_revoked_retry_s_pending_call_is_pushed_once_though_task_revoked_comes_twice(
    timed: tuple[Backend, FakeClock],
) -> None:
    # Celery: revoke of a reserved task (its retry, waiting for its eta) runs _on_revoked at once
    # (_free_at_revoke's revoke_and_free), and Celery's own task_revoked runs it again later.
    from uniqjob import _job_sync

    Latest.enqueue("e", 1)
    (job,) = jobs.jobs
    jobs.jobs.clear()
    running = Latest.lock_from(job.key, job.token)  # a worker runs it...
    running.start()
    assert isinstance(Latest.enqueue("e", 2), Pending)  # ...a call comes meanwhile...
    assert running.requeue(delay=60)  # ...and the task fails: its retry is due in a minute

    def on_revoked() -> None:  # the body of celery._on_revoked (not terminated)
        lock = Latest.lock_from(job.key, job.token)
        lock.release()
        _job_sync.next_call(Latest, lock, lock.backend)

    on_revoked()  # revoke_and_free, as the command arrives
    on_revoked()  # Celery's own task_revoked, once a pool child or the eta reaches the request
    pushed = [(j.token, j.job_id) for j in jobs.jobs]
    work()
    assert Latest.runs == [2], pushed


def test_an_inline_call_made_before_the_undo_s_round_is_not_dropped_by_it(
    store: Backend, monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    # As test_review_coalesce's lost-reply test, but the next trigger comes before the undo's round.
    real = store.finish

    def applied_then_lost(key: str, token: str, **options: Any) -> PendingCall | None:
        monkeypatch.setattr(store, "finish", real)
        real(key, token, **options)  # applied: the pending call (2) is queued; the reply never arrives
        raise BackendError("connection lost while reading the reply", store.name)

    def meanwhile() -> None:
        assert isinstance(Inline.enqueue("b", 2), Pending)
        monkeypatch.setattr(store, "finish", applied_then_lost)

    Inline.during = meanwhile
    Inline.run("b", 1)
    result = Inline.run("b", 3)  # the next trigger, in this process, before the undo's next round
    undos.flush()
    Inline.run("b", 4)
    assert 3 in Inline.runs, (Inline.runs, result)


def test_celery_on_revoked_twice_for_one_revoke_pushes_a_pending_call_once(
    timed: tuple[Backend, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same through celery._on_revoked itself: revoke_and_free (_free_at_revoke) runs it as the
    # revoke command arrives, and Celery's own task_revoked runs it again later (docs/celery.md).
    pytest.importorskip("celery")
    from types import SimpleNamespace

    from tests.celery_app import latest
    from uniqjob.integrations import HEADER
    from uniqjob.integrations.celery import _on_revoked

    job = latest.unique_job
    pushes: list[Any] = []
    monkeypatch.setattr(job.unique_queue, "push", lambda cls, lock, args, kwargs: pushes.append(lock.token))
    first = job.lock("e", 1)
    assert first.acquire()  # the task is sent (its queue lock, queued)
    running = job.lock_from(first.key, first.token)
    running.start()  # a worker runs it
    assert not job.lock("e", 2).acquire()  # a call meanwhile: the pending call behind the run
    assert running.requeue(delay=60)  # the task raised: self.retry(countdown=60) keeps the lock
    request = SimpleNamespace(
        headers={HEADER: {"key": first.key, "token": first.token}}, id="t-1", args=("e", 1), kwargs={}
    )
    _on_revoked(sender=latest, request=request)  # revoke_and_free
    _on_revoked(sender=latest, request=request)  # Celery's own task_revoked
    assert len(pushes) == 1, pushes


def test_a_claim_whose_leftover_the_undo_removed_first_is_granted(
    store: Backend, monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    real_claim, real_reclaim = store.claim, store.reclaim

    def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(store, "claim", real_claim)
        real_claim(*args, **kwargs)  # applied: its queue lock is this process's leftover
        raise BackendError("connection lost while reading the reply", store.name)

    def undo_thread_first(key: str, queue_token: str | None, run_token: str | None) -> bool:
        # The undo thread's round lands between the next claim's refusal and its reclaim of the
        # leftover (_reclaim_ours): the reclaim finds nothing, the key is free all the same.
        monkeypatch.setattr(store, "reclaim", real_reclaim)
        undos.flush()
        return real_reclaim(key, queue_token, run_token)

    monkeypatch.setattr(store, "claim", applied_then_lost)
    with pytest.raises(BackendError):
        Plain.enqueue("r", 1)
    monkeypatch.setattr(store, "reclaim", undo_thread_first)
    assert Plain.enqueue("r", 2) is not None  # granted, not taken for a duplicate of the leftover


def test_an_async_claim_settles_its_key_s_failed_release_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, no_undo_thread: None
) -> None:
    """The settle a claim makes first may wait for the store (each try is a store call): from an event
    loop it runs in a worker thread, and the loop's other tasks go on meanwhile."""
    import asyncio
    import threading
    import time

    from uniqjob import JobLock, MemoryBackend

    store = MemoryBackend()
    lock = JobLock(store, "slow-settle")
    tried_on: list[threading.Thread] = []

    def act() -> bool:  # a store that takes its time to answer
        tried_on.append(threading.current_thread())
        time.sleep(0.3)
        return True

    undos.add(act, "a test's undo", (), lock.key)

    async def main() -> tuple[bool, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        try:
            took = await lock.aacquire()
        finally:
            ticker.cancel()
        return took, ticks

    try:
        took, ticks = asyncio.run(main())
    finally:
        undos.clear()
    assert took and tried_on and tried_on[0] is not threading.main_thread()
    assert ticks >= 5  # the loop ran on through the settle's 0.3 s
    assert not undos.pending  # settled: done, and forgotten
