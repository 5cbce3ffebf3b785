"""The Dramatiq integration in one process: Dramatiq's own ``Worker`` threads on its ``StubBroker``.

What a user meets when declaring and sending (settings as actor and message
options, their mistakes named) and what the worker does with the lock (run,
retry, dead-letter, drop past ``max_age``, reschedule, concurrency). The same
promises against real ``dramatiq`` worker processes on Redis and RabbitMQ are
in tests/test_dramatiq_workers.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import AsyncIO
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend

import uniqjob
from tests.integration_workers import wait_until
from uniqjob import ConfigurationError, JobNotUnique, Parked, Pending
from uniqjob.integrations.dramatiq import DramatiqQueue, UniqueMiddleware, job_of
from uniqjob.locks import LockState
from uniqjob.ops import duplicates
from uniqjob.stores.memory import MemoryBackend

QUEUE = "uniqjob-stub"
broker = StubBroker()
broker.add_middleware(AsyncIO())  # for async actors
broker.add_middleware(UniqueMiddleware())

#: What the actors saw, and the events that let them end.
seen: list[Any] = []
gates: dict[str, threading.Event] = {}


def _wait(name: str) -> None:
    if not gates.setdefault(name, threading.Event()).wait(10):
        raise TimeoutError(f"gate {name} never opened")


@dramatiq.actor(broker=broker, queue_name=QUEUE, unique=True, unique_lock_autoexpire=600, max_retries=0)
def export(n: int) -> int:
    seen.append(("export", n, job_of(export).is_locked(n), export.send(n)))
    _wait(f"export-{n}")
    return n


@dramatiq.actor(
    broker=broker,
    queue_name=QUEUE,
    unique=True,
    unique_lock_autoexpire=600,
    max_retries=1,
    min_backoff=100,
    max_backoff=200,
)
def flaky(n: int) -> None:
    seen.append(("flaky", n))
    _wait(f"flaky-{n}-{len(seen)}")
    raise RuntimeError("fails")


@dramatiq.actor(
    broker=broker, queue_name=QUEUE, unique=True, unique_on_conflict="reschedule", unique_reschedule_delay=0.1
)
def later(n: int) -> None:
    seen.append(("later", n))
    _wait(f"later-{n}-{len(seen)}")


@dramatiq.actor(
    broker=broker,
    queue_name=QUEUE,
    unique=True,
    unique_lock_autoexpire=600,
    concurrency_limit=1,
    max_retries=0,
)
def single(n: int) -> None:
    seen.append(("single", n))
    _wait(f"single-{n}")


@dramatiq.actor(broker=broker, queue_name=QUEUE, unique=True, unique_lock_autoexpire=600)
async def fetch(n: int) -> None:
    await asyncio.sleep(0)
    seen.append(("fetch", n, await job_of(fetch).ais_locked(n)))


@dramatiq.actor(
    broker=broker,
    queue_name=QUEUE,
    unique=True,
    unique_on_conflict="keep_last",
    unique_args=("n",),
    max_retries=0,
)
def sync(n: int, revision: int) -> None:
    """keep_last: its first run gets three sends, then fails for good; the last send runs next."""
    seen.append(("sync", revision))
    if revision == 1:
        assert isinstance(sync.send(n, 2), Pending)
        sync.send(n, 3)
        sync.send(n, 4)
        raise RuntimeError("fails, with no retry left")


@dramatiq.actor(broker=broker, queue_name=QUEUE)
def plain(n: int) -> int:
    return n


@pytest.fixture(autouse=True)
def store() -> Iterator[MemoryBackend]:
    backend = MemoryBackend()
    uniqjob.configure(backend)
    seen.clear()
    gates.clear()
    broker.flush_all()
    yield backend
    for event in list(gates.values()):
        event.set()  # nothing left waiting
    uniqjob.configure(None)


class Workers:
    """Dramatiq's Worker on the stub broker, started when the test says (what is sent before waits)."""

    def __init__(self) -> None:
        self.worker = dramatiq.Worker(broker, worker_timeout=20, worker_threads=2)
        self.started = False

    def start(self) -> None:
        self.worker.start()
        self.started = True

    def join(self) -> None:
        """Wait until every message sent (and each retry) is done."""
        broker.join(QUEUE, fail_fast=False)
        self.worker.join()


@pytest.fixture
def worker() -> Iterator[Workers]:
    workers = Workers()
    yield workers
    if workers.started:
        workers.worker.stop()


def open_gate(name: str) -> None:
    gates.setdefault(name, threading.Event()).set()


def state(actor: Any, *args: object) -> LockState:
    return uniqjob.default_backend().read(job_of(actor).lock_key(*args))


def until(condition: Callable[[], object], what: str) -> None:
    wait_until(condition, what, timeout=10)


def test_a_duplicate_is_dropped_while_queued_and_while_running_and_counted(worker: Workers) -> None:
    message = export.send(1)
    assert isinstance(message, dramatiq.Message)
    queued = state(export, 1)
    assert queued.queue is not None and queued.queue.state == "queued"
    assert queued.queue.meta.job_id == message.message_id  # the lock records the message id
    assert [export.send(1) for _ in range(3)] == [None] * 3
    assert export.send_with_options(args=(1,), delay=50) is None

    worker.start()
    until(lambda: seen, "the actor to start")
    assert seen == [("export", 1, True, None)]  # running: still locked, a send from inside dropped
    assert export.send(1) is None
    assert duplicates() == {"tests.test_dramatiq.export": 6}  # `uniqjob stats` counts them

    open_gate("export-1")
    worker.join()
    assert not job_of(export).is_locked(1)
    assert isinstance(export.send(1), dramatiq.Message)  # free again


def test_a_call_in_place_takes_no_lock_and_a_message_sent_around_it_is_locked_by_its_arguments(
    worker: Workers,
) -> None:
    worker.start()
    open_gate("export-2")
    assert export(2) == 2  # a plain function call, as Dramatiq's
    assert seen[0][:3] == ("export", 2, False)  # ran at once, unlocked: its own send went through
    assert isinstance(seen[0][3], dramatiq.Message)
    worker.join()
    seen.clear()

    broker.enqueue(export.message(3))  # Dramatiq's own API: no lock taken when sent
    open_gate("export-3")
    until(lambda: seen, "the actor to start")
    assert seen[0][2] is True  # locked as it ran, by its arguments
    worker.join()
    assert not job_of(export).is_locked(3)


def test_a_retry_keeps_the_lock_and_the_last_failure_frees_it(worker: Workers) -> None:
    worker.start()
    first = flaky.send(5)
    open_gate("flaky-5-1")
    until(lambda: state(flaky, 5).run is None and len(seen) == 1, "the first attempt to fail")
    between = state(flaky, 5)
    assert between.queue is not None and between.queue.state == "queued"  # kept for the retry
    assert between.queue.token == first.options["uniqjob"]["token"]
    assert flaky.send(5) is None  # still unique while the retry waits
    open_gate("flaky-5-2")
    worker.join()
    assert len(seen) == 2 and len(broker.dead_letters) == 1  # dead-lettered after its one retry
    assert not job_of(flaky).is_locked(5)


def test_a_message_past_its_max_age_is_dropped_and_frees_its_lock(worker: Workers) -> None:
    export.send_with_options(args=(4,), max_age=1)
    threading.Event().wait(0.01)  # older than its max_age by the time it is taken
    worker.start()
    worker.join()
    assert seen == [] and len(broker.dead_letters) == 1
    assert not job_of(export).is_locked(4)


def test_reschedule_sends_the_duplicate_again_once_the_key_is_free(worker: Workers) -> None:
    worker.start()
    later.send(6)
    until(lambda: seen, "the first to start")
    assert later.send(6) is None  # rescheduled: a delayed message that sends it again
    threading.Event().wait(0.3)  # it comes back, finds the key still held, and is rescheduled again
    assert seen == [("later", 6)]
    open_gate("later-6-1")
    until(lambda: len(seen) == 2, "the rescheduled call to run")
    open_gate("later-6-2")
    worker.join()
    assert not job_of(later).is_locked(6)


def test_block_parks_over_the_limit_and_sends_in_turn(worker: Workers) -> None:
    worker.start()
    single.send(1)
    parked = single.send(2)
    assert isinstance(parked, Parked)  # no message: it waits in the store
    until(lambda: seen, "the first to start")
    open_gate("single-1")
    until(lambda: len(seen) == 2, "the parked call to be sent and run")
    assert seen == [("single", 1), ("single", 2)]
    open_gate("single-2")
    worker.join()


def test_an_async_actor_runs_under_its_lock(worker: Workers) -> None:
    assert job_of(fetch).lock_key(1) == job_of(fetch).lock_key(n=1)  # keyed by its signature
    fetch.send(1)
    assert fetch.send(1) is None
    worker.start()
    worker.join()
    assert seen == [("fetch", 1, True)]
    assert not job_of(fetch).is_locked(1)


def test_use_existing_gives_a_duplicate_the_holder_s_message_whose_result_it_reads() -> None:
    """Policy "use_existing": a duplicate send returns the holder's message, to wait for its result."""
    results = StubBackend()
    own = StubBroker()
    own.add_middleware(Results(backend=results))  # type: ignore[no-untyped-call]
    own.add_middleware(UniqueMiddleware())

    @dramatiq.actor(
        broker=own, unique=True, unique_lock_autoexpire=600, unique_on_conflict="use_existing",
        store_results=True,
    )  # fmt: skip
    def double(n: int) -> int:
        return 2 * n

    sent = double.send(21)
    again = double.send(21)  # a duplicate: the message already queued, not None
    queue = job_of(double).unique_queue
    assert isinstance(queue, DramatiqQueue)
    assert again is not None and again.message_id == sent.message_id
    assert queue.handle(state(double, 21).queue.meta.job_id).message_id == sent.message_id  # type: ignore[union-attr]
    running = dramatiq.Worker(own, worker_timeout=20)
    running.start()
    try:
        assert again.get_result(backend=results, block=True, timeout=10_000) == 42
    finally:
        running.stop()


def test_keep_last_sends_the_waiting_call_when_the_running_one_fails_for_good(worker: Workers) -> None:
    sync.send(5, 1)
    worker.start()
    until(lambda: len(seen) == 2 and not job_of(sync).is_locked(5, 0), "the last send to run")
    assert seen == [("sync", 1), ("sync", 4)]


def test_replace_is_refused_dramatiq_cannot_take_a_message_out_of_its_queue() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"actor 'swap': unique_on_conflict 'replace' takes the queued message out of its queue, and"
        r" Dramatiq cannot remove a message once it is sent",
    ):

        @dramatiq.actor(broker=broker, unique=True, unique_on_conflict="replace")
        def swap(n: int) -> None: ...

    assert "swap" not in broker.actors
    with pytest.raises(
        ConfigurationError, match=r"export\.send_with_options\(\): unique_on_conflict 'replace'"
    ):
        export.send_with_options(args=(1,), unique_on_conflict="replace")
    assert not job_of(export).is_locked(1)


def test_settings_for_one_message() -> None:
    export.send(7)
    with pytest.raises(JobNotUnique):
        export.send_with_options(args=(7,), unique_on_conflict="raise")
    message = export.send_with_options(args=(8,), delay=60_000, unique_lock_autoexpire=30)
    assert "unique_lock_autoexpire" not in message.options  # applied, not sent
    queued = state(export, 8).queue
    assert queued is not None and queued.ttl is not None
    assert 89 < queued.ttl <= 90  # its autoexpire, plus its delay
    with pytest.raises(ConfigurationError, match=r"'unique_on_conflit'.*did you mean 'unique_on_conflict'"):
        export.send_with_options(args=(9,), unique_on_conflit="raise")
    with pytest.raises(ConfigurationError, match="unique_args cannot be given for one call"):
        export.send_with_options(args=(9,), unique_args=("n",))
    assert not job_of(export).is_locked(9)


def test_a_misspelt_actor_option_is_named() -> None:
    with pytest.raises(
        ConfigurationError, match=r"actor 'typo':.*unique_on_conflit.*did you mean 'unique_on_conflict'"
    ):

        @dramatiq.actor(broker=broker, unique=True, unique_on_conflit="raise")
        def typo(n: int) -> None: ...

    assert "typo" not in broker.actors
    with pytest.raises(ConfigurationError, match="unique_on_conflict must be one of"):

        @dramatiq.actor(broker=broker, unique=True, unique_on_conflict="ignore")
        def bad_policy(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match="unique_lock_autoexpire needs unique=True"):

        @dramatiq.actor(broker=broker, unique_lock_autoexpire=60)
        def half(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match="queue is Dramatiq's"):

        @dramatiq.actor(broker=broker, unique=True, unique_queue=None)
        def queued(n: int) -> None: ...

    with pytest.raises(ConfigurationError, match="actor 'plain' is not unique"):
        job_of(plain)


def test_without_the_middleware_a_unique_actor_is_refused_by_dramatiq() -> None:
    bare = StubBroker()
    with pytest.raises(ValueError, match=r"undefined: unique\b.*forget to add a middleware"):

        @dramatiq.actor(broker=bare, unique=True)
        def lonely(n: int) -> None: ...
