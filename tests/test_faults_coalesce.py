"""Coalescing's store steps (issue 24) under real wire faults, at each moment of a call.

The claims of "keep_last" (into a queued call, and as the pending call behind a running one),
"replace" and a debounced burst, and the release that hands the pending call on, are each made
through a loopback TCP proxy (tests/support/proxy.py) that, while the call is under way:

- ``never_sent``: forwards nothing, then drops the connection (the request never reaches Redis);
- ``lost_reply``: lets the request through, withholds its reply, then drops it (applied, unheard);
- ``late_request``: forwards nothing until the caller gave up, then delivers the request (applied
  after its caller was told it failed, maybe after its undo ran once).

Whatever the moment, the promise: each call runs at most once, a call its caller saw succeed is
never lost, and the key serves its next call. The store is a real redis-server of this module's
own; the worker is played in this process (``work``), as in tests/test_review_coalesce.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import uniqjob
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support.proxy import FaultProxy
from uniqjob import Pending, Queue, UniqueJob, _undo
from uniqjob._undo import undos
from uniqjob.errors import BackendError
from uniqjob.joblock import JobLock
from uniqjob.ops import iter_rows
from uniqjob.stores.redis import RedisBackend

_TIMEOUT = 0.3  # the store's socket timeout: a fault longer than this fails the call


@dataclass
class Pushed:
    cls: type[UniqueJob]
    key: str
    token: str
    job_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Jobs(Queue):
    """A queue in this process that names its jobs before the claim, and proves a lost job gone."""

    suspect_after = 0.0  # a lock whose job is not here is reclaimed by the key's next call

    def __init__(self) -> None:
        self.jobs: list[Pushed] = []
        self.made = 0

    def new_job_id(self) -> str:
        self.made += 1
        return f"job-{self.made}"

    def push(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any) -> str:
        self.jobs.append(Pushed(job_cls, lock.key, lock.token, lock.meta.job_id, tuple(args), dict(kwargs)))
        return lock.meta.job_id

    def push_in(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any, delay: float) -> str:
        return self.push(job_cls, lock, args, kwargs)

    def handle(self, job_id: str) -> str:
        return job_id

    def remove(self, job_id: str) -> None:
        self.jobs = [job for job in self.jobs if job.job_id != job_id]

    def job_gone(self, job_id: str) -> bool:
        return all(job.job_id != job_id for job in self.jobs)


jobs = Jobs()


def work() -> None:
    """Run every job in the queue, in order, as a worker does (jobs pushed meanwhile run too)."""
    while jobs.jobs:
        job = jobs.jobs.pop(0)
        job.cls.execute(job.cls.lock_from(job.key, job.token), job.args, job.kwargs)


class _Recorded(UniqueJob):
    unique_queue = jobs
    unique_args = ("name",)
    unique_run_lease = 600  # never lapses during a test: what is left, the test sees
    runs: ClassVar[list[int]]
    during: ClassVar[Callable[[], None] | None] = None

    def perform(self, name: str, version: int) -> None:
        self.runs.append(version)
        during, type(self).during = type(self).during, None
        if during is not None:
            during()


class Plain(_Recorded):
    runs: ClassVar[list[int]] = []


class Latest(_Recorded):
    unique_on_conflict = "keep_last"
    runs: ClassVar[list[int]] = []


class Swap(_Recorded):
    unique_on_conflict = "replace"
    runs: ClassVar[list[int]] = []


class Debounced(_Recorded):
    unique_debounce = 0.05
    runs: ClassVar[list[int]] = []


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", server.port)) as proxy:
        yield proxy


@pytest.fixture
def store(proxy: FaultProxy, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RedisBackend:
    """A Redis store through the proxy, the default; an undo finding nothing settles in 0.3 s."""
    monkeypatch.setattr(_undo, "SETTLE", 0.3)
    backend = RedisBackend(proxy.url, timeout=_TIMEOUT, namespace=request.node.name)
    uniqjob.configure(backend)
    jobs.jobs.clear()
    for cls in (Plain, Latest, Swap, Debounced):
        cls.runs.clear()
        cls.during = None
    return backend


@contextmanager
def never_sent(proxy: FaultProxy) -> Iterator[None]:
    proxy.pause()
    yield
    proxy.drop()
    proxy.resume()


@contextmanager
def lost_reply(proxy: FaultProxy) -> Iterator[None]:
    proxy.hold_replies()
    yield
    proxy.drop()
    proxy.resume()


@contextmanager
def late_request(proxy: FaultProxy) -> Iterator[None]:
    proxy.pause()
    yield
    proxy.resume()


Moment = Callable[[FaultProxy], AbstractContextManager[None]]
MOMENTS = pytest.mark.parametrize("moment", [never_sent, lost_reply, late_request], ids=lambda m: m.__name__)


def failed(proxy: FaultProxy, moment: Moment, call: Callable[[], object]) -> None:
    """Make ``call`` during ``moment``: its caller is told the store failed."""
    with moment(proxy), pytest.raises(BackendError):
        call()


def settled(store: RedisBackend) -> None:
    """Wait until every undo of a failed call is done (a late request has long arrived by then)."""
    store.client.ping()  # the store answers again
    wait_until(lambda: undos.flush() and not undos, "the undos of the failed calls", timeout=15)


def held(store: RedisBackend) -> list[str | None]:
    """The keys the store still holds a lock on."""
    return [row.key for row in iter_rows(store)]


@MOMENTS
def test_keep_last_into_a_queued_call(store: RedisBackend, proxy: FaultProxy, moment: Moment) -> None:
    Latest.enqueue("a", 1)
    failed(proxy, moment, lambda: Latest.enqueue("a", 2))
    settled(store)
    work()
    assert Latest.runs in ([1], [2])  # one run, with the arguments of either call
    assert held(store) == []
    Latest.enqueue("a", 3)
    work()
    assert Latest.runs[-1] == 3 and len(Latest.runs) == 2


@MOMENTS
def test_keep_last_behind_a_running_call(store: RedisBackend, proxy: FaultProxy, moment: Moment) -> None:
    def meanwhile() -> None:
        assert isinstance(Latest.enqueue("b", 2), Pending)  # succeeded: it must run
        failed(proxy, moment, lambda: Latest.enqueue("b", 3))

    Latest.enqueue("b", 1)
    Latest.during = meanwhile
    work()
    settled(store)
    work()
    assert Latest.runs in ([1, 2], [1, 3]), Latest.runs
    assert held(store) == []


@MOMENTS
def test_replace_of_a_queued_call(store: RedisBackend, proxy: FaultProxy, moment: Moment) -> None:
    Swap.enqueue("c", 1)
    failed(proxy, moment, lambda: Swap.enqueue("c", 2))
    settled(store)
    work()
    assert Swap.runs == [1]  # the failed call never took the queued one's place
    assert held(store) == []
    Swap.enqueue("c", 3)
    work()
    assert Swap.runs == [1, 3]


@MOMENTS
def test_a_debounced_burst(store: RedisBackend, proxy: FaultProxy, moment: Moment) -> None:
    Debounced.enqueue("d", 1)
    failed(proxy, moment, lambda: Debounced.enqueue("d", 2))
    settled(store)
    wait_until(lambda: not jobs.jobs or _due(store), "the burst's due time")
    work()
    assert Debounced.runs in ([1], [2])
    assert held(store) == []


def _due(store: RedisBackend) -> bool:
    """The debounced lock is due (its job, started now, would run rather than wait)."""
    return all(row.due_s is None or row.due_s <= 0 for row in iter_rows(store))


@MOMENTS
def test_the_release_that_hands_on_the_pending_call(
    store: RedisBackend, proxy: FaultProxy, moment: Moment
) -> None:
    # An inline run's release (FINISH) fails at the moment: it is made again once the store
    # answers, and the pending call it queued is pushed then, as the release would have.
    fault = moment(proxy)

    def meanwhile() -> None:
        assert isinstance(Latest.enqueue("e", 2), Pending)
        fault.__enter__()  # armed for the release that follows perform

    Latest.during = meanwhile
    Latest.run("e", 1)  # never raises for its release
    assert jobs.jobs == []  # not pushed: the release's reply never came
    fault.__exit__(None, None, None)
    settled(store)
    work()
    assert Latest.runs == [1, 2]
    assert held(store) == []
    Latest.enqueue("e", 3)
    work()
    assert Latest.runs == [1, 2, 3]


@MOMENTS
def test_an_inline_release_is_made_again_once_the_store_answers(
    store: RedisBackend, proxy: FaultProxy, moment: Moment
) -> None:
    # Its locks would refuse the key for a whole lease (600 s here) if the release were not retried.
    fault = moment(proxy)
    Plain.during = fault.__enter__
    Plain.run("f", 1)
    fault.__exit__(None, None, None)
    settled(store)
    assert held(store) == []
    Plain.enqueue("f", 2)
    work()
    assert Plain.runs == [1, 2]
