"""The job layer under faults: lost replies leave no stranded lock, fences, current_lock, release.

The stores are real: a private redis-server that these tests stop (SIGSTOP)
so that a request reaches it but its reply never comes back in time, and the
file and memory stores behind a wrapper whose call is applied, then fails.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import uniqjob
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import module_redis_server  # noqa: F401 - the `server` fixture
from uniqjob import BackendError, JobLock, UniqueJob
from uniqjob._undo import undos
from uniqjob.joblock import Strategy
from uniqjob.locks import LockState, QueueMeta, RunClaim
from uniqjob.queues import Queue
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend


@pytest.fixture
def stalling(server: RedisServer) -> Iterator[RedisBackend]:
    """A Redis store with a short socket timeout on a server the test may SIGSTOP (always resumed)."""
    if server.pid is None:
        server.start()
    backend = RedisBackend(server.url, timeout=0.5, namespace=f"f{time.monotonic_ns()}")
    backend.client.flushall()
    yield backend
    assert server.pid is not None
    os.kill(server.pid, signal.SIGCONT)
    backend.close()


@pytest.fixture(autouse=True)
def _no_leftover_undos() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 5
    while undos and time.monotonic() < deadline:
        time.sleep(0.05)


class _Push(Queue):
    """A queue that keeps what it is handed."""

    def __init__(self) -> None:
        self.pushed: list[tuple[Any, ...]] = []

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.pushed.append(args)
        return len(self.pushed)


def _stall(server: RedisServer, seconds: float) -> threading.Thread:
    """SIGSTOP the server now and SIGCONT it ``seconds`` later, from a thread."""
    assert server.pid is not None
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=resume)
    thread.start()
    return thread


@pytest.mark.slow
def test_lost_claim_reply_on_redis_leaves_no_stranded_queue_lock(
    server: RedisServer, stalling: RedisBackend
) -> None:
    """Issue 10, case 2: a claim applied by the server whose reply was lost blocked the key for good."""
    queue = _Push()

    class Export(UniqueJob):
        unique_backend = stalling
        unique_queue = queue

        def perform(self, n: int) -> None: ...

    assert Export.enqueue(0) == 1  # the kept connection is open: the next request reaches the server
    resumed = _stall(server, 1.5)
    with pytest.raises(BackendError):
        Export.enqueue(1)
    resumed.join()
    # Once the store answers again, the very next call is taken (not dropped as a duplicate): it
    # undoes the applied claim it finds in its way. (Counted in calls, not in seconds of a busy machine.)
    assert Export.enqueue(1) is not None
    assert queue.pushed == [(0,), (1,)]


@pytest.mark.slow
def test_lost_claim_reply_is_undone_in_the_background(server: RedisServer, stalling: RedisBackend) -> None:
    """Another process sees the key free soon after the store answers, with no further call here."""
    lock = JobLock(stalling, "nightly", meta=QueueMeta("Export", "1"))
    assert stalling.read("nightly").free
    stalling.read("warm")  # a connection is open for this thread
    resumed = _stall(server, 1.5)
    with pytest.raises(BackendError):
        lock.acquire()
    resumed.join()
    wait_until(lambda: stalling.read("nightly").free, "the key to be free")


@pytest.mark.slow
def test_lost_reply_of_an_inline_run_does_not_hold_the_key_for_a_lease(
    server: RedisServer, stalling: RedisBackend
) -> None:
    """With run(), the caller's own pid held a `running` lock with no heartbeat until the lease lapsed."""
    ran: list[int] = []

    class Nightly(UniqueJob):
        unique_backend = stalling
        unique_run_lease = 60.0

        def perform(self, n: int) -> None:
            ran.append(n)

    Nightly.run(0)
    resumed = _stall(server, 1.5)
    with pytest.raises(BackendError):
        Nightly.run(1)
    resumed.join()
    assert Nightly.run(1) is None and ran == [0, 1]  # the very next call runs


class _AppliedThenFails(Backend):
    """Wraps a store: ``step`` (claim or start) is applied, then raises as if its reply had been lost."""

    def __init__(self, inner: Backend, failures: int = 1, step: str = "claim") -> None:
        self.inner = inner
        self.failures = failures
        self.step = step
        self.name = inner.name

    def _lost(self, step: str, reply: Any) -> Any:
        if step == self.step and self.failures > 0:
            self.failures -= 1
            raise BackendError("reply lost", self.name)
        return reply

    def claim(self, key: str, token: str, **kw: Any) -> LockState | None:
        state: LockState | None = self._lost("claim", self.inner.claim(key, token, **kw))
        return state

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # the abstract primitives, passed through
    def start(self, *a: Any, **kw: Any) -> Any:
        return self._lost("start", self.inner.start(*a, **kw))

    def attach(self, *a: Any, **kw: Any) -> Any:
        return self.inner.attach(*a, **kw)

    def requeue(self, *a: Any, **kw: Any) -> Any:
        return self.inner.requeue(*a, **kw)

    def renew(self, *a: Any, **kw: Any) -> Any:
        return self.inner.renew(*a, **kw)

    def finish(self, *a: Any, **kw: Any) -> Any:
        return self.inner.finish(*a, **kw)

    def dequeue(self, *a: Any, **kw: Any) -> Any:
        return self.inner.dequeue(*a, **kw)

    def reclaim(self, *a: Any, **kw: Any) -> Any:
        return self.inner.reclaim(*a, **kw)

    def read(self, *a: Any, **kw: Any) -> Any:
        return self.inner.read(*a, **kw)

    def scan(self) -> Any:
        return self.inner.scan()


def test_an_applied_claim_that_failed_is_undone_on_every_store(backend: Backend) -> None:
    wrapped = _AppliedThenFails(backend)
    lock = JobLock(wrapped, "k", meta=QueueMeta("C", ""))
    with pytest.raises(BackendError):
        lock.acquire(run=True)
    wait_until(lambda: backend.read("k").free, "the key to be free")
    assert JobLock(backend, "k").acquire()


@pytest.mark.parametrize("strategy", ["while_executing", "until_and_while_executing"])
@pytest.mark.slow
def test_a_with_block_whose_start_was_applied_but_failed_is_undone_on_every_store(
    backend: Backend, strategy: Strategy
) -> None:
    # ``with Job.lock(...)``: the start's reply lost. Left, its run lock (and its queue lock)
    # would drop every call of the key for a lease, or for good.
    lock = JobLock(_AppliedThenFails(backend, step="start"), "k", meta=QueueMeta("C", ""), strategy=strategy)
    with pytest.raises(BackendError), lock:
        raise AssertionError("the body must not run")
    wait_until(lambda: backend.read("k").free, "the key to be free")
    with JobLock(backend, "k", strategy=strategy):
        pass


@pytest.mark.slow
def test_a_failed_claim_draws_a_new_token(backend: Backend) -> None:
    wrapped = _AppliedThenFails(backend)
    lock = JobLock(wrapped, "k")
    first = lock.token
    with pytest.raises(BackendError):
        lock.acquire()
    assert lock.token != first
    wait_until(lambda: not undos, "the undo to be done")
    assert lock.acquire()  # the undo of the old token never touches the new lock
    time.sleep(0.1)
    state = backend.read("k")
    assert state.queue is not None and state.queue.token == lock.token


# -- fences ------------------------------------------------------------------------------


def test_each_perform_sees_a_larger_fence(backend: Backend) -> None:
    seen: list[int | None] = []

    class Write(UniqueJob):
        unique_backend = backend

        def perform(self, n: int) -> None:
            current = uniqjob.current_lock()
            assert current is not None
            seen.append(current.fence)

    for n in (1, 1, 2, 1):
        Write.run(n)
    assert all(isinstance(f, int) and f > 0 for f in seen)
    assert seen[0] is not None and seen[1] is not None and seen[3] is not None
    assert seen[0] < seen[1] < seen[3]  # key 1, three grants


def test_current_lock_is_none_outside_perform_and_restored_after(backend: Backend) -> None:
    inner: list[JobLock | None] = []

    class Outer(UniqueJob):
        unique_backend = backend

        def perform(self) -> None:
            mine = uniqjob.current_lock()
            Inner.run()
            inner.append(uniqjob.current_lock())
            assert inner[-1] is mine

    class Inner(UniqueJob):
        unique_backend = backend

        def perform(self) -> None:
            inner.append(uniqjob.current_lock())

    assert uniqjob.current_lock() is None
    Outer.run()
    assert uniqjob.current_lock() is None
    assert inner[0] is not None and inner[0].key.startswith(Inner.job_name())


def test_worker_side_start_gets_a_fence(backend: Backend) -> None:
    queue = _Push()

    class Queued(UniqueJob):
        unique_backend = backend
        unique_queue = queue

        def perform(self) -> int | None:
            current = uniqjob.current_lock()
            return None if current is None else current.fence

    lock = Queued.lock()
    assert lock.acquire()
    worker = Queued.lock_from(lock.key, lock.token)
    fence = Queued.execute(worker, (), {})
    assert isinstance(fence, int) and fence > 0
    assert worker.fence == fence


# -- release never raises ------------------------------------------------------------------


class _Boom(Exception):
    pass


def test_release_after_perform_never_raises_whatever_the_client_throws(tmp_path: Path) -> None:
    store = MemoryBackend()

    class Finish(UniqueJob):
        unique_backend = store

        def perform(self) -> str:
            return "done"

    def broken(*_a: Any, **_kw: Any) -> None:
        raise _Boom("a client bug")  # not a BackendError

    store.finish = broken  # type: ignore[method-assign]
    assert Finish.run() == "done"


def test_on_lost_is_a_checked_setting() -> None:
    with pytest.raises(uniqjob.ConfigurationError, match="unique_on_lost"):

        class Bad(UniqueJob):
            unique_on_lost = "page me"  # type: ignore[assignment]

            def perform(self) -> None: ...


def test_run_claim_records_the_fence_the_store_issued() -> None:
    store = MemoryBackend()
    claim = RunClaim(uniqjob.locks.local_holder(), 5.0, "a")
    assert store.claim("k", "t", meta=QueueMeta(), run=claim) is None
    assert claim.fence > 0
    state = store.read("k")
    assert state.run is not None and state.run.fence == claim.fence


def test_a_call_with_an_int_too_long_for_str_runs_and_is_previewed() -> None:
    """Issue 10, case 5: the key of 10**5000 was fine, but the lock's argument preview raised ValueError."""
    store = MemoryBackend()

    class Once(UniqueJob):
        unique_backend = store

        def perform(self, n: int) -> str:
            return "ran"

    assert Once.run(10**5000) == "ran"
    lock = Once.lock(10**5000)
    assert lock.meta.args.startswith("<int of ")


def test_a_corrupt_record_is_an_answer_not_a_lost_reply(file_backend: Backend) -> None:
    """A claim refused because the record is unreadable was not applied: nothing to undo."""
    lock = JobLock(file_backend, "k")
    assert lock.acquire()
    path = next(p for p in Path(str(file_backend.directory)).glob("*.json"))  # type: ignore[attr-defined]
    path.write_text("{not json")
    with pytest.raises(uniqjob.CorruptRecordError):
        JobLock(file_backend, "k").acquire()
    assert not undos


class _StartFails(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def start(self, *a: Any, **kw: Any) -> Any:
        if self.fail:
            self.fail = False
            raise BackendError("the store went away", self.name)
        return super().start(*a, **kw)


def test_a_failed_start_of_an_inline_call_gives_its_queued_lock_back() -> None:
    """A queue lock taken by acquire() stayed queued forever when the start step after it failed."""
    store = _StartFails()
    ran: list[int] = []

    class Twice(UniqueJob):
        unique_backend = store
        unique_strategy = "until_and_while_executing"

        def perform(self, n: int) -> None:
            ran.append(n)

    with pytest.raises(BackendError):
        Twice.run(1)
    assert store.read(Twice.lock_key(1)).free
    Twice.run(1)
    assert ran == [1]


def test_a_failed_start_of_a_delivery_is_settled_as_a_failure() -> None:
    store = _StartFails()
    settled: list[BaseException | None] = []

    class Worker(UniqueJob):
        unique_backend = store
        unique_queue = _Push()

        def perform(self) -> None: ...

    lock = Worker.lock()
    assert lock.acquire()
    worker = Worker.lock_from(lock.key, lock.token)
    with pytest.raises(BackendError):
        Worker.execute(worker, (), {}, settle=lambda exc, _result: settled.append(exc))
    assert len(settled) == 1 and isinstance(settled[0], BackendError)


class _SlowClaim(MemoryBackend):
    """A store whose claims are answered after ``delay`` seconds (a reply held up by a stall)."""

    def __init__(self, delay: float, renew_ok: bool = True) -> None:
        super().__init__()
        self.delay = delay
        self.renew_ok = renew_ok
        self.renewals = 0

    def claim(self, *a: Any, **kw: Any) -> Any:
        state = super().claim(*a, **kw)
        time.sleep(self.delay)
        return state

    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        self.renewals += 1
        return super().renew(key, token, lease, attempt) and self.renew_ok


def test_a_grant_that_arrives_past_the_holders_deadline_is_confirmed_before_perform() -> None:
    """Else perform would start with its lock already presumed lost, and no heartbeat to keep it."""
    store = _SlowClaim(delay=0.8)
    seen: list[bool] = []

    class Late(UniqueJob):
        unique_backend = store
        unique_run_lease = 1.0  # presumed lost 0.67 s after the claim was sent

        def perform(self) -> None:
            current = uniqjob.current_lock()
            assert current is not None
            seen.append(current.lost)

    Late.run()
    assert store.renewals >= 1
    assert seen == [False]


def test_a_late_grant_that_cannot_be_confirmed_does_not_run() -> None:
    store = _SlowClaim(delay=0.8, renew_ok=False)
    ran: list[int] = []

    class Late(UniqueJob):
        unique_backend = store
        unique_run_lease = 1.0

        def perform(self) -> None:
            ran.append(1)

    with pytest.raises(BackendError, match="granted too late"):
        Late.run()
    assert ran == []
    assert store.read(Late.lock_key()).free


@pytest.mark.slow
def test_a_grant_slower_than_a_third_of_the_lease_is_renewed_in_time() -> None:
    """The first renewal is due one interval after the grant was sent, not after its slow reply."""
    store = _SlowClaim(delay=0.6)  # lease 1.5: more than a third, less than two thirds
    seen: list[bool] = []

    class Slow(UniqueJob):
        unique_backend = store
        unique_run_lease = 1.5

        def perform(self) -> None:
            time.sleep(1.6)
            current = uniqjob.current_lock()
            assert current is not None
            seen.append(current.lost)

    Slow.run()
    assert seen == [False]
    assert store.renewals >= 2


class _RenewStalls(MemoryBackend):
    """A store whose renewals fail while ``down`` is set, or hang for ``hang`` seconds."""

    def __init__(self, hang: float = 0.0) -> None:
        super().__init__()
        self.down = threading.Event()
        self.hang = hang

    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        if self.hang:
            time.sleep(self.hang)
        if self.down.is_set():
            raise BackendError("stalled", self.name)
        return super().renew(key, token, lease, attempt)


@pytest.mark.slow
def test_a_lock_presumed_lost_is_still_renewed_if_the_store_comes_back_in_time() -> None:
    """An in-process perform is not interrupted: its lock must not lapse when the store is back."""
    store = _RenewStalls()
    lock = JobLock(store, "k", lease=1.5)
    assert lock.acquire(run=True)
    with lock.running(started=True):
        store.down.set()
        wait_until(
            lambda: lock.lost, "the lock to be presumed lost", 3.0
        )  # presumed lost 1 s after the grant
        store.down.clear()  # back before the lease (1.5 s) lapses
        time.sleep(1.2)  # past the lease: only renewals keep it
        state = store.read("k")
        assert state.run is not None and state.run.token == lock.token
        assert lock.lost  # latched: the holder was told to stop, and is not told otherwise


@pytest.mark.slow
def test_a_store_that_hangs_holds_up_no_other_stores_renewals() -> None:
    hanging = _RenewStalls(hang=3.0)
    healthy = MemoryBackend()
    slow = JobLock(hanging, "a", lease=0.9)
    fine = JobLock(healthy, "b", lease=0.9)
    assert slow.acquire(run=True) and fine.acquire(run=True)
    with slow.running(started=True), fine.running(started=True):
        time.sleep(1.5)
        assert not fine.lost
        assert slow.lost


_EXITING_CLIENT = """
import sys
from uniqjob import BackendError, JobLock
from uniqjob.stores.redis import RedisBackend

store = RedisBackend(sys.argv[1], timeout=0.5)
JobLock(store, "warm").acquire()  # the connection open, the claim and reclaim scripts loaded
store.reclaim("warm", "", "")
print("ready", flush=True)
sys.stdin.readline()  # the replies are held from now on
try:
    JobLock(store, "cron-key").acquire()
except BackendError:
    print("failed", flush=True)
sys.stdin.readline()  # the replies flow again: exit at once
"""


@pytest.mark.slow
def test_a_process_that_exits_after_a_lost_claim_reply_undoes_it_on_its_way_out(
    server: RedisServer, stalling: RedisBackend
) -> None:
    """A cron script whose enqueue failed exits at once: its applied claim must not outlive it."""
    import subprocess
    import sys

    from tests.support.proxy import FaultProxy

    with FaultProxy(("127.0.0.1", server.port)) as proxy:
        child = subprocess.Popen(
            [sys.executable, "-c", _EXITING_CLIENT, f"{proxy.url}?timeout=0.5"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        proxy.hold_replies()
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.25)  # the claim has reached the server and is applied; its reply is held
        proxy.pause()  # and nothing more gets through: the background undo's tries time out
        assert child.stdout.readline().strip() == "failed"
        time.sleep(0.8)  # its first try has failed; it waits before the next
        proxy.drop()
        proxy.resume()
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    plain = RedisBackend(server.url)
    try:
        # The claim reached the server (only its reply was held); the exiting process removed it.
        assert plain.client.keys("uniqjob:{cron-key}:q") == []
    finally:
        plain.close()
