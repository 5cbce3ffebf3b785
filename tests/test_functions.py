"""``@uniqjob.unique``: plain functions as unique jobs, inline and on real ``rq worker`` processes."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import pickle
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

import uniqjob
from tests.conftest import FakeClock
from tests.functions_jobs import Reports, gated, queued, send_report, ticked
from tests.integration_workers import URL_VAR, Workers, count, open_gate, wait_until, worker_pool
from tests.redis_server import RedisServer
from tests.rq_jobs import QUEUE, rq_queue
from uniqjob import ConfigurationError, JobNotUnique, MemoryBackend, UniqueJob, UniqueKeyError, unique
from uniqjob.functions import OPTIONS, UniqueFunction
from uniqjob.keys import make_key

# -- inline calls --------------------------------------------------------------------------


def test_a_call_runs_under_its_lock_and_releases_it() -> None:
    assert send_report(42, "q3") == f"report 42 q3 under {send_report.lock_key(42)}"
    assert not send_report.is_locked(42)


def test_a_duplicate_while_the_first_runs_is_the_policy_s_conflict() -> None:
    seen: list[object] = []

    @unique(args=("n",))
    def outer(n: int) -> str:
        seen.append(outer(n))  # the same key, while this call holds it: dropped ("log")
        seen.append(outer.is_locked(n))
        return "ran"

    assert outer(1) == "ran"
    assert seen == [None, True]
    assert not outer.is_locked(1)

    @unique(on_conflict="raise")
    def strict(n: int) -> None:
        strict(n)

    with pytest.raises(JobNotUnique) as caught:
        strict(2)
    assert caught.value.key == strict.lock_key(2)


def test_the_key_is_the_function_s_name_and_its_keyed_arguments() -> None:
    assert send_report.unique_job.job_name() == "tests.functions_jobs.send_report"
    key = send_report.lock_key(42)
    assert key == make_key("tests.functions_jobs.send_report", {"account_id": 42})
    assert send_report.lock_key(42, "other note") == send_report.lock_key(account_id=42) == key
    # pinned: keys live in stores across deploys (see tests/test_keys_pinned.py)
    assert key == "tests.functions_jobs.send_report:1:c09942af8d211b0642dd449698ea2ccd"

    @unique
    def every_argument(a: int, b: str = "x") -> None: ...

    name = f"{__name__}.test_the_key_is_the_function_s_name_and_its_keyed_arguments.<locals>.every_argument"
    assert every_argument.lock_key(1) == make_key(name, {"a": 1, "b": "x"})


def test_a_key_function_and_other_settings_reach_the_job_class() -> None:
    @unique(key=lambda account_id, note="": account_id % 10, lock_limit=2, concurrency_limit=3)
    def report(account_id: int, note: str = "") -> int:
        return account_id

    assert report.lock_key(12) == report.lock_key(2) != report.lock_key(3)
    job = report.unique_job
    assert issubclass(job, UniqueJob)
    assert (job.unique_lock_limit, job.concurrency_limit) == (2, 3)

    @unique(concurrency_limit=1, concurrency_key=lambda account_id: f"account-{account_id}")
    def per_account(account_id: int) -> int:
        return account_id

    assert per_account.unique_job.semaphore(5).key == f"{__name__}.{per_account.__qualname__}:account-5"
    assert per_account(5) == 5
    assert report(12) == 12


def test_metadata_signature_and_pickling_are_the_function_s() -> None:
    assert send_report.__name__ == "send_report"
    assert send_report.__qualname__ == "send_report"
    assert send_report.__module__ == "tests.functions_jobs"
    assert send_report.__doc__ == "Send account ``account_id`` its report."
    assert isinstance(send_report.__wrapped__, type(test_metadata_signature_and_pickling_are_the_function_s))
    assert str(inspect.signature(send_report)) == "(account_id: 'int', note: 'str' = '') -> 'str'"
    assert pickle.loads(pickle.dumps(send_report)) is send_report
    assert pickle.loads(pickle.dumps(Reports.build)) is Reports.build
    bound = pickle.loads(pickle.dumps(Reports("p").build))
    assert isinstance(bound, UniqueFunction) and bound(5) == "p5"
    assert repr(send_report) == "<unique function tests.functions_jobs.send_report>"


def test_methods_leave_self_out_of_the_key() -> None:
    first, second = Reports("a-"), Reports("b-")
    assert first.build(7) == "a-7"
    assert first.build.lock_key(7) == second.build.lock_key(7) == Reports.build.lock_key(first, 7)
    assert first.build.lock_key(7) == make_key("tests.functions_jobs.Reports.build", {"account_id": 7})
    assert not first.build.is_locked(7)
    with pytest.raises(UniqueKeyError, match=r"self: values of type tests\.functions_jobs\.Reports"):
        first.keyed.lock_key(7)  # args names self: then it is keyed, and must be a key's value


def test_enqueue_without_a_queue_runs_inline() -> None:
    assert send_report.enqueue(3) == f"report 3  under {send_report.lock_key(3)}"
    lock = send_report.lock(3)
    assert lock.key == send_report.lock_key(3) and lock.ttl == 3600


def test_once_per_runs_once_per_tick_of_the_store_s_clock() -> None:
    clock = FakeClock(start=600.0 * 1000)
    uniqjob.configure(MemoryBackend(clock=clock))
    runs: list[float] = []

    @unique(once_per="10m")
    def sweep() -> float:
        runs.append(clock.now)
        return clock.now

    assert sweep() == clock.now
    clock.advance(300)
    assert sweep() is None and sweep.is_locked()  # the same tick: dropped, its lock kept
    clock.advance(300)  # the next tick (its lock's key names the tick)
    assert sweep() == clock.now
    assert len(runs) == 2


# -- configuration errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_conflct": "raise"}, "@unique has no option 'on_conflct' (did you mean 'on_conflict'?"),
        ({"autoexpire": 5}, "did you mean 'lock_autoexpire'?"),
        (
            {"on_conflict": "rase"},
            "@unique(on_conflict=...) on tests.test_functions.test_bad_options_fail_when_the_function_is_"
            "decorated.<locals>.f: on_conflict must be",
        ),
        ({"strategy": "until_done"}, "strategy must be one of until_executed"),
        ({"lock_autoexpire": -1}, "lock_autoexpire must be positive and finite, got -1"),
        ({"run_lease": "long"}, "run_lease must be a number of seconds or a timedelta"),
        ({"args": ("acount",)}, "args names acount, not parameters of perform(account: 'int')"),
        ({"args": "account"}, "args must be a tuple of parameter names"),
        ({"lock_limit": 0}, "lock_limit must be a whole number >= 1"),
        ({"backend": 3}, "backend must be a Backend or a URL, got int"),
        ({"queue": "rq"}, "queue must be a uniqjob.Queue, got str"),
        ({"key": "account"}, "@unique option 'key' must be a function of the call, got str"),
        ({"concurrency_limit": 0}, "concurrency_limit must be a whole number >= 1 or None"),
        ({"concurrency_duration": 60}, "concurrency_duration has no effect without concurrency_limit"),
        ({"once_per": "5x"}, "once_per: bad period '5x'"),
        ({"once_per": 60, "lock_autoexpire": 5}, "drop unique_lock_autoexpire"),
        ({"once_per": 60, "strategy": "while_executing"}, "takes no unique_strategy 'while_executing'"),
        ({"once_per": 60, "on_conflict": "reschedule"}, "'reschedule' would run them in a later tick"),
    ],
)
def test_bad_options_fail_when_the_function_is_decorated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:

        @unique(**options)
        def f(account: int) -> None: ...

    assert message in str(caught.value)


def test_every_setting_is_an_option() -> None:
    settings = {name for name in vars(UniqueJob) if name.startswith(("unique_", "concurrency_"))}
    assert set(OPTIONS.values()) == settings
    assert OPTIONS["on_conflict"] == "unique_on_conflict" and OPTIONS["key"] == "unique_key"
    assert OPTIONS["concurrency_limit"] == "concurrency_limit"


def test_what_cannot_be_decorated_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not async generator"):

        @unique
        async def fetch() -> AsyncIterator[None]:
            yield None

    with pytest.raises(ConfigurationError, match="@unique decorates a function, got 42"):
        unique()(42)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="@unique decorates a function"):
        unique(UniqueJob)


@pytest.mark.parametrize("kind", ["method", "staticmethod", "classmethod"])
def test_an_async_perform_is_refused_by_the_sync_api_and_awaited_by_the_async_one(kind: str) -> None:
    async def perform(*args: object) -> str:
        return "awaited"

    body: Any = {
        "method": perform,
        "staticmethod": staticmethod(perform),
        "classmethod": classmethod(perform),
    }
    job: Any = type("Fetch", (UniqueJob,), {"perform": body[kind], "unique_backend": MemoryBackend()})
    for entry in (job.run, job.enqueue):
        with pytest.raises(ConfigurationError, match=r"Fetch.perform is an async function: call it through"):
            entry()
    assert not job.is_locked()  # refused before any lock was taken
    assert asyncio.run(job.arun()) == "awaited"


def test_an_async_function_stays_a_coroutine_function() -> None:
    """Frameworks (Starlette, FastAPI, arq, pytest) ask this of an endpoint or a job function."""

    @unique(on_conflict="raise")
    async def fetch(n: int, label: str = "x", *, mode: str = "y") -> str:
        return f"{label}{n}{mode}"

    class Client:
        @unique
        async def get(self, n: int) -> int:
            return n

    for decorated in (fetch, Client.get, Client().get):
        assert inspect.iscoroutinefunction(decorated), decorated
        assert asyncio.iscoroutinefunction(decorated), decorated
    assert str(inspect.signature(fetch)) == str(inspect.signature(fetch.__wrapped__))
    got = Client().get(2)
    assert got is not None and asyncio.run(fetch(1)) == "x1y" and asyncio.run(got) == 2
    assert not inspect.iscoroutinefunction(send_report) and not asyncio.iscoroutinefunction(send_report)


# -- on real rq worker processes -------------------------------------------------------------


@pytest.fixture
def workers(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Workers]:
    monkeypatch.setenv(URL_VAR, redis_server.url)
    uniqjob.configure(redis_server.url)
    with worker_pool(redis_server.url, tmp_path) as pool:
        yield pool


def start_worker(workers: Workers, name: str) -> None:
    rq = str(Path(sys.executable).with_name("rq"))
    url = os.environ[URL_VAR]
    workers.start(name, [rq, "worker", "-u", url, "-n", f"{name}-{uuid.uuid4().hex[:8]}", QUEUE])


@pytest.mark.slow
def test_the_queue_s_own_enqueue_still_runs_under_the_run_lock(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "one")
    start_worker(workers, "two")
    q: Queue = rq_queue()
    first = q.enqueue(gated, "a")  # RQ's own API: nothing of ours at enqueue
    wait_until(lambda: count(redis_client, "started", "a") == 1, "the job to start")
    state = uniqjob.default_backend().read(gated.lock_key("a"))
    assert state.run is not None and state.run.holder.pid != os.getpid()  # held in the work horse
    assert gated.is_locked("a")

    second = q.enqueue(gated, "a")  # RQ queues it; the other worker meets the run lock
    wait_until(lambda: second.get_status() == JobStatus.FINISHED, "the duplicate to be dropped")
    assert second.return_value() is None and count(redis_client, "started", "a") == 1

    open_gate(redis_client, "a")
    wait_until(lambda: first.get_status() == JobStatus.FINISHED, "the first to finish")
    assert first.return_value() == "a"
    assert not gated.is_locked("a")


def test_enqueue_on_an_rq_queue_takes_the_queue_lock_at_enqueue(
    workers: Workers, redis_client: redis.Redis
) -> None:
    job = queued.enqueue("b")
    assert isinstance(job, Job)
    assert [queued.enqueue("b") for _ in range(5)] == [None] * 5  # dropped before RQ sees them
    assert len(rq_queue()) == 1
    start_worker(workers, "one")
    wait_until(lambda: count(redis_client, "started", "b") == 1, "the job to start")
    assert queued.enqueue("b") is None
    open_gate(redis_client, "b")
    wait_until(lambda: job.get_status() == JobStatus.FINISHED, "the job to finish")
    assert job.return_value() == "b" and count(redis_client, "started", "b") == 1
    wait_until(lambda: not queued.is_locked("b"), "its lock to go")


def test_once_per_on_an_rq_queue_keeps_the_tick_after_the_worker_ran_it(
    workers: Workers, redis_client: redis.Redis
) -> None:
    start_worker(workers, "one")
    job = ticked.enqueue("t")
    assert isinstance(job, Job)
    open_gate(redis_client, "t")
    wait_until(lambda: job.get_status() == JobStatus.FINISHED, "the job to finish")
    assert job.return_value() == "t"
    lock = ticked.lock("t")
    state = uniqjob.default_backend().read(lock.key)
    assert state.run is None and state.queue is not None and state.queue.state == "queued"
    assert ticked.is_locked("t") and ticked.enqueue("t") is None  # the tick ran: kept to its end
    assert count(redis_client, "started", "t") == 1


def test_rq_s_own_enqueue_shows_the_function_s_name(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``q.enqueue(send_report, 43)`` reads in RQ (and rq-dashboard) as the function, not ``__call__``."""
    monkeypatch.setenv(URL_VAR, redis_server.url)  # redis_client: an empty server
    q = rq_queue()
    job = q.enqueue(send_report, 43)
    assert job.func_name == "tests.functions_jobs.send_report"
    assert job.description == "tests.functions_jobs.send_report(43)"
    fetched = Job.fetch(job.id, connection=q.connection)
    assert fetched.func is send_report and fetched.instance is None and fetched.args == (43,)
    method = q.enqueue(Reports.build, Reports("p"), 5)  # through the class: the function, self an argument
    assert method.func_name == "tests.functions_jobs.Reports.build"
    bound = Job.fetch(q.enqueue(Reports("p").build, 5).id, connection=q.connection)
    assert bound.func(*bound.args) == "p5"  # through an instance: the bound call, as before


def test_wraps_is_what_update_wrapper_sets() -> None:
    for attr in functools.WRAPPER_ASSIGNMENTS:
        assert getattr(send_report, attr) == getattr(send_report.__wrapped__, attr)
