"""Unique Dramatiq actors, imported by the test process and by the ``dramatiq`` worker processes.

The broker is the test Redis (``UNIQJOB_TEST_REDIS_URL``); the queue's name is
``UNIQJOB_TEST_DRAMATIQ_QUEUE``. Both are read when this module is first
imported, so the test process imports it once the session's redis-server is up
(tests/test_dramatiq_workers.py, the ``app`` fixture) and each worker inherits them.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from tests.integration_workers import (
    URL_VAR,
    client,
    job_done,
    job_started,
    pretend_other_host,
    wait_for_gate,
)
from uniqjob.integrations.dramatiq import UniqueMiddleware

pretend_other_host()

QUEUE_VAR = "UNIQJOB_TEST_DRAMATIQ_QUEUE"
QUEUE = os.environ.get(QUEUE_VAR, "uniqjob-test")


broker = RedisBroker(url=os.environ[URL_VAR])  # type: ignore[no-untyped-call]
#: The results of actors declared with store_results=True (use_existing's handle reads them).
results = RedisBackend(url=os.environ[URL_VAR])  # type: ignore[no-untyped-call]
broker.add_middleware(Results(backend=results))  # type: ignore[no-untyped-call]
broker.add_middleware(UniqueMiddleware())
dramatiq.set_broker(broker)


def gated(name: str) -> str:
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


@dramatiq.actor(
    queue_name=QUEUE, unique=True, unique_lock_autoexpire=600, unique_run_lease=2.0, max_retries=0
)
def gate(name: str) -> None:
    """Starts, then waits until the test opens its gate."""
    gated(name)


@dramatiq.actor(
    queue_name=QUEUE,
    unique=True,
    unique_lock_autoexpire=600,
    unique_run_lease=2.0,
    max_retries=2,
    min_backoff=200,
    max_backoff=400,
)
def flaky(name: str, failures: int) -> None:
    """Fails its first ``failures`` attempts, each when the test opens its gate; retried twice."""
    fail_at_first(name, failures)


def fail_at_first(name: str, failures: int) -> None:
    """Wait at gate ``NAME:ATTEMPT``, then fail if this is one of the first ``failures`` attempts."""
    r = client()
    attempt = job_started(r, name)
    wait_for_gate(r, f"{name}:{attempt}")
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} of {name} fails")
    job_done(r, name)


@dramatiq.actor(
    queue_name=QUEUE,
    unique=True,
    unique_lock_autoexpire=600,
    unique_on_conflict="reschedule",
    unique_reschedule_delay=0.5,
)
def rescheduled(name: str) -> None:
    """A duplicate tries again half a second later instead of being dropped."""
    gated(name)


@dramatiq.actor(queue_name=QUEUE, unique=True, unique_lock_autoexpire=600, concurrency_limit=1, max_retries=0)
def one_at_a_time(name: str) -> None:
    """One concurrency slot for the actor: the others park, and are enqueued in turn."""
    gated(name)


def versioned(name: str, version: int, *, wait: bool = True) -> int:
    """Record ``version`` in ``versions:NAME``, then run as :func:`gated` does (``wait``: at its gate)."""
    r = client()
    r.rpush(f"versions:{name}", version)
    job_started(r, name)
    if wait:
        wait_for_gate(r, name)
    job_done(r, name)
    return version


@dramatiq.actor(
    queue_name=QUEUE,
    unique=True,
    unique_on_conflict="keep_last",
    unique_args=("name",),
    unique_lock_autoexpire=600,
    unique_run_lease=2.0,
    max_retries=0,
)
def latest(name: str, version: int) -> None:
    """keep_last: sends of one name coalesce, the latest version wins; each run waits at its gate."""
    versioned(name, version)


@dramatiq.actor(
    queue_name=QUEUE,
    unique=True,
    unique_debounce=1.0,
    unique_args=("name",),
    unique_lock_autoexpire=600,
    unique_run_lease=2.0,
    max_retries=0,
)
def debounced(name: str, version: int) -> None:
    """Runs a second after the last send of its name, with that send's version."""
    versioned(name, version, wait=False)


@dramatiq.actor(
    queue_name=QUEUE,
    unique=True,
    unique_on_conflict="use_existing",
    unique_lock_autoexpire=600,
    unique_run_lease=2.0,
    max_retries=0,
    store_results=True,
)
def existing(name: str) -> str:
    """use_existing: a duplicate send gets the message already on its way, whose result it reads."""
    return gated(name)
