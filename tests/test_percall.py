"""Settings for one call (``Job.using(...)``), and a conflict that says when it clears (issue 23, §1 and §2).

Inline calls and the store contract here, on the session's redis-server and on
the memory store with an injected clock; the queues' own per-call paths are in
``test_percall_{celery,rq,arq}.py``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import re
from datetime import timedelta

import pytest
import redis
import rq

from tests.conftest import FakeClock
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, JobLock, JobNotUnique, Queue, UniqueJob, unique
from uniqjob.errors import holder_text
from uniqjob.integrations.rq import RQQueue
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend


def _job(store: object, **settings: object) -> type[UniqueJob]:
    """A job class ``Export`` on ``store`` with these ``unique_*`` settings (named without the prefix)."""
    seen: list[int] = []

    def perform(self: UniqueJob, account_id: int, note: str = "") -> int:
        seen.append(account_id)
        return account_id

    attrs: dict[str, object] = {"__module__": __name__, "__qualname__": "Export", "perform": perform}
    attrs.update(unique_backend=store, unique_run_lease=30.0, seen=seen)
    attrs.update({f"unique_{name}": value for name, value in settings.items()})
    return type("Export", (UniqueJob,), attrs)


# -- §1: per-call settings ---------------------------------------------------------------------


def test_using_keeps_the_class_name_and_its_key_bytes(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    Export = _job(redis_backend)
    once = Export.using(on_conflict="raise", lock_autoexpire=60)
    assert once is not Export and issubclass(once, Export)
    assert (once.__module__, once.__qualname__, once.__name__) == (
        Export.__module__,
        Export.__qualname__,
        Export.__name__,
    )
    assert once.job_name() == Export.job_name()
    assert once.lock_key(42) == Export.lock_key(42) == Export.lock_key(account_id=42, note="")

    lock = Export.lock(42)
    assert lock.acquire()
    by_class = sorted(redis_client.keys("*"))
    lock.release()
    redis_client.flushdb()
    per_call = once.lock(42)
    assert per_call.acquire()
    assert sorted(redis_client.keys("*")) == by_class  # the very bytes the class's own lock takes
    queued = redis_backend.read(Export.lock_key(42)).queue
    assert queued is not None and queued.meta.cls == Export.job_name()
    assert queued.ttl is not None and 59 < queued.ttl <= 60  # this call's autoexpire
    assert Export.autoexpire() is None and Export.unique_on_conflict == "log"  # the class is untouched
    per_call.release()


def test_a_calls_settings_apply_to_that_call_only(redis_backend: RedisBackend) -> None:
    Export = _job(redis_backend)
    held = Export.lock(7)
    assert held.acquire()
    assert Export.run(7) is None  # the class's "log": dropped
    with pytest.raises(JobNotUnique):
        Export.using(on_conflict="raise").run(7)
    with pytest.raises(JobNotUnique):
        Export.using(on_conflict="raise").enqueue(7)  # no queue: inline, like run()
    with pytest.raises(JobNotUnique):
        asyncio.run(Export.using(on_conflict="raise").arun(7))
    with pytest.raises(JobNotUnique):
        asyncio.run(Export.using(on_conflict="raise").aenqueue(7))
    assert Export.run(7) is None  # and the class's own policy again
    held.release()
    assert Export.using(on_conflict="raise").run(7) == 7
    assert Export.seen == [7]  # type: ignore[attr-defined]


def test_a_per_call_class_is_made_once_per_settings_and_chains(redis_backend: RedisBackend) -> None:
    Export = _job(redis_backend)
    first = Export.using(on_conflict="raise", lock_autoexpire=60)
    assert Export.using(lock_autoexpire=60, on_conflict="raise") is first
    assert Export.using(on_conflict="raise", lock_autoexpire=60.0) is not first  # 60.0 is another value
    assert Export.using() is Export
    chained = Export.using(on_conflict="raise").using(lock_autoexpire=60)
    assert chained is first  # made from the class, with both settings
    assert chained.using(on_conflict="discard").unique_on_conflict == "discard"
    assert Export.using(lock_autoexpire=timedelta(minutes=2)).autoexpire() == 120.0


def test_bad_per_call_settings_are_configuration_errors_naming_them(redis_backend: RedisBackend) -> None:
    Export = _job(redis_backend)
    with pytest.raises(
        ConfigurationError, match=r"'on_conflit' is not a uniqjob setting \(did you mean 'on_conflict'"
    ):
        Export.using(on_conflit="raise")
    with pytest.raises(ConfigurationError, match="'unique_on_conflict' is not a uniqjob setting"):
        Export.using(unique_on_conflict="raise")  # using() takes them without the prefix
    with pytest.raises(
        ConfigurationError,
        match="must be one of log, discard, raise, reschedule, use_existing, keep_last, replace; got 'boom'",
    ):
        Export.using(on_conflict="boom")
    with pytest.raises(ConfigurationError, match=r"Export.using\(\) \(lock_autoexpire=-1\): .*positive"):
        Export.using(lock_autoexpire=-1)
    with pytest.raises(ConfigurationError, match="must be a number of seconds or a timedelta"):
        Export.using(lock_autoexpire=[60])  # unhashable too: checked, not cached
    with pytest.raises(ConfigurationError, match="unique_reschedule_delay must be seconds >= 0"):
        Export.using(reschedule_delay="soon")
    reasons = {
        "strategy": "what the worker holds while the job runs",
        "run_lease": "renewed by the worker",
        "on_lost": "called in the worker",
        "args": "it makes the key",
        "key": "it makes the key",
        "once_per": "it makes the key",
        "lock_limit": "shared by every call of the key",
        "backend": "the worker finds the lock in the class's store",
        "queue": "proves them gone",
        "concurrency_limit": "shared by every call of the key",
    }
    for name, reason in reasons.items():
        with pytest.raises(ConfigurationError) as refused:
            Export.using(**{name: None})
        assert f"{name} cannot be given for one call: " in str(refused.value)
        assert reason in str(refused.value) and "set it on the class" in str(refused.value)


class _NoDelays(Queue):
    """A queue that cannot delay jobs (no push_later)."""

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        pass


def test_per_call_values_are_checked_against_the_class(redis_backend: RedisBackend) -> None:
    Queued = _job(redis_backend, queue=_NoDelays(), lock_autoexpire=60)
    with pytest.raises(ConfigurationError, match="'reschedule', but _NoDelays cannot delay jobs"):
        Queued.using(on_conflict="reschedule")
    Expiring = _job(redis_backend, strategy="until_expired", lock_autoexpire=5)
    with pytest.raises(ConfigurationError, match="'until_expired' needs unique_lock_autoexpire"):
        Expiring.using(lock_autoexpire=None)
    Ticking = _job(redis_backend, once_per="5m")
    with pytest.raises(ConfigurationError, match="drop unique_lock_autoexpire"):
        Ticking.using(lock_autoexpire=60)


def test_a_per_call_class_does_not_log_the_classes_warnings_again(
    redis_backend: RedisBackend, caplog: pytest.LogCaptureFixture
) -> None:
    class Blind(Queue):
        def push(
            self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[object, ...], kwargs: dict[str, object]
        ) -> None:
            pass

    with caplog.at_level(logging.WARNING, logger="uniqjob.settings"):
        Export = _job(redis_backend, queue=Blind())
        assert caplog.text.count("cannot prove a job gone") == 1
        Export.using(on_conflict="raise")
        assert caplog.text.count("cannot prove a job gone") == 1
        Export.using(lock_autoexpire=60)
        assert caplog.text.count("cannot prove a job gone") == 1


def test_a_per_call_class_is_warned_about_its_store_as_its_class(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queue = RQQueue(rq.Queue("percall-warnings", connection=redis.Redis.from_url(redis_server.url)))
    Export = _job(None, queue=queue, lock_autoexpire=60)  # on the per-host default store, never chosen
    with caplog.at_level(logging.WARNING, logger="uniqjob"):
        Export.using(on_conflict="raise").enqueue(1)
        Export.enqueue(2)
        Export.using(lock_autoexpire=30).enqueue(3)
    warned = [r.getMessage() for r in caplog.records if "only this host sees" in r.getMessage()]
    assert len(warned) == 1  # once for the class, whatever settings its calls gave


def test_a_unique_function_takes_settings_for_one_call(redis_backend: RedisBackend) -> None:
    calls: list[int] = []

    @unique(backend=redis_backend)
    def send_report(account_id: int) -> int:
        calls.append(account_id)
        return account_id

    strict = send_report.using(on_conflict="raise", lock_autoexpire=60)
    assert strict.lock_key(3) == send_report.lock_key(3)
    assert strict.__qualname__ == send_report.__qualname__
    held = send_report.lock(3)
    assert held.acquire()
    assert send_report(3) is None
    with pytest.raises(JobNotUnique):
        strict(3)
    held.release()
    assert strict(3) == 3 and calls == [3]
    with pytest.raises(ConfigurationError, match=r"send_report.using\(\): 'on_conflit' is not"):
        send_report.using(on_conflit="raise")


# -- §2: a conflict says when it clears ---------------------------------------------------------


def test_a_queued_conflict_clears_at_its_autoexpire_as_the_server_counts(redis_backend: RedisBackend) -> None:
    Export = _job(redis_backend, on_conflict="raise")
    assert Export.using(lock_autoexpire=12.3).lock(1).acquire()
    with pytest.raises(JobNotUnique) as raised:
        Export.run(1)
    holder = raised.value.holder
    assert holder["clears_by"] == "autoexpire"
    assert isinstance(holder["clears_in"], float) and 12.0 < holder["clears_in"] <= 12.3
    assert re.search(r"clears in 12\.[0-3]s \(autoexpire\)", str(raised.value))
    again = pickle.loads(pickle.dumps(raised.value))  # as a worker sends it back: the same facts
    assert again.holder == holder and str(again) == str(raised.value)


def test_nothing_but_its_holder_ends_a_queued_lock_without_autoexpire(redis_backend: RedisBackend) -> None:
    Export = _job(redis_backend, on_conflict="raise")
    assert Export.lock(2).acquire()
    with pytest.raises(JobNotUnique) as raised:
        Export.run(2)
    assert "clears_in" in raised.value.holder and raised.value.holder["clears_in"] is None
    assert "clears_by" not in raised.value.holder and "clears" not in str(raised.value)


def test_a_running_conflict_clears_with_its_lease(redis_backend: RedisBackend) -> None:
    class Running(UniqueJob):
        unique_backend = redis_backend
        unique_on_conflict = "raise"
        unique_run_lease = 20.0

        def perform(self, n: int) -> None:
            pass

    lock = Running.lock(1)
    with lock:  # running: the queue lock "running", and the run lock renewed by the heartbeat
        with pytest.raises(JobNotUnique) as raised:
            Running.run(1)
        with pytest.raises(JobNotUnique) as queued_behind:
            Running.using(lock_autoexpire=100).lock(1).start()  # a start: refused by the run lock alone
    for exc in (raised.value, queued_behind.value):
        assert exc.holder["clears_by"] == "lease"
        assert 19 < exc.holder["clears_in"] <= 20
        assert re.search(r"clears in (19\.\d|20\.0)s \(lease, unless its holder renews it\)", str(exc))


def test_clears_in_is_the_stores_clock_not_the_callers() -> None:
    clock = FakeClock()
    store = MemoryBackend(clock=clock)
    holder = JobLock(store, "k", ttl=30, lease=10)
    assert holder.acquire()
    clock.advance(12)  # the store's clock only: the caller's time.time() has not moved
    waiting = JobLock(store, "k")
    assert not waiting.acquire()
    assert waiting.conflict is not None
    facts = waiting.conflict.describe()
    assert facts["clears_in"] == 18.0 and facts["clears_by"] == "autoexpire"


def test_which_lock_ends_it_depends_on_what_the_call_needs() -> None:
    clock = FakeClock()
    store = MemoryBackend(clock=clock)
    running = JobLock(store, "k", ttl=5, lease=30)
    assert running.acquire(run=True)  # queued "running" until autoexpire in 5 s, run lock for 30 s
    enqueue = JobLock(store, "k")
    assert not enqueue.acquire()  # an enqueue waits only for the queue lock: its autoexpire
    assert enqueue.conflict is not None and enqueue.conflict.clears() == (5.0, "autoexpire")
    inline = JobLock(store, "k")
    assert not inline.acquire(run=True)  # an inline run waits for the run lock too
    assert inline.conflict is not None and inline.conflict.clears() == (30.0, "lease")
    clock.advance(6)  # the queue lock autoexpired: an enqueue queues behind the running job
    behind = JobLock(store, "k", ttl=60)
    assert behind.acquire()
    third = JobLock(store, "k")
    assert not third.acquire(run=True)
    assert third.conflict is not None and third.conflict.clears() == (60.0, "autoexpire")  # the later one
    worker = JobLock(store, "k", token=behind.token)  # behind's own delivery: waits for the run lock
    with pytest.raises(JobNotUnique) as raised:
        worker.start()
    assert raised.value.holder["clears_in"] == 24.0 and raised.value.holder["clears_by"] == "lease"
    lapsed = JobLock(store, "k")
    clock.advance(25)  # the running holder stopped beating: its lease lapsed
    assert not lapsed.acquire()
    assert lapsed.conflict is not None and lapsed.conflict.clears() == (35.0, "autoexpire")


def test_the_holder_phrase_puts_clears_in_after_the_facts() -> None:
    facts = {"state": "queued", "since": 0.5, "job_id": "j1", "clears_in": 12.34, "clears_by": "autoexpire"}
    assert holder_text(facts) == "queued, taken 0.500s ago, job id j1, clears in 12.3s (autoexpire)"
    assert holder_text({"state": "queued", "clears_in": None}) == "queued"
