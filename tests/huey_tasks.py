"""Unique Huey tasks, imported by the test process and by the ``huey_consumer`` processes.

Huey's storage is the test Redis (``UNIQJOB_TEST_REDIS_URL``); the test process
points it there itself (:func:`connect`), since the URL is known only once the
session's redis-server is up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from huey import crontab
from huey.exceptions import RetryTask

from tests.integration_workers import (
    URL_VAR,
    client,
    job_done,
    job_started,
    pretend_other_host,
    wait_for_gate,
)
from uniqjob.integrations.huey import UniqueRedisHuey

pretend_other_host()

huey = UniqueRedisHuey("uniqjob-test", url=os.environ.get(URL_VAR) or "redis://127.0.0.1:1/0")


def connect(url: str) -> None:
    """Point the test process's Huey at the Redis at ``url``."""
    huey.storage_kwargs = {"url": url}
    huey.storage = huey.create_storage()


def unique_task(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@huey.task(unique=True, **options)``, typed loosely (huey has no types)."""
    decorator: Callable[[Callable[..., Any]], Any] = huey.task(unique=True, **options)
    return decorator


def _gated(name: str) -> str:
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


@unique_task(unique_run_lease=1.0, unique_lock_autoexpire=600)
def gate(name: str) -> str:
    """Starts, then waits until the test opens its gate."""
    return _gated(name)


@unique_task(unique_on_conflict="raise", unique_lock_autoexpire=600)
def strict(name: str) -> str:
    """A duplicate raises JobNotUnique."""
    return name


@unique_task(
    unique_run_lease=1.0,
    unique_lock_autoexpire=600,
    unique_on_conflict="reschedule",
    unique_reschedule_delay=1,
)
def rescheduled(name: str) -> str:
    """A duplicate comes back a second later (through Huey's schedule) instead of being dropped."""
    return _gated(name)


@unique_task(retries=2, retry_delay=1, unique_run_lease=2.0, unique_lock_autoexpire=600)
def flaky(name: str, failures: int) -> int:
    """Fails its first ``failures`` attempts (each once gate ``name:attempt`` opens); retried twice."""
    r = client()
    attempt = job_started(r, name)
    wait_for_gate(r, f"{name}:{attempt}")
    if attempt == 1 and failures < 0:
        raise RetryTask(delay=1)  # asks for a retry, whatever the retries left
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} of {name} fails")
    job_done(r, name)
    return attempt


_periodic: Callable[[Callable[..., Any]], Any] = huey.periodic_task(crontab(minute="*"), unique=True)


@_periodic
def every_minute() -> None:
    """Counts its runs (consumers other than the periodic test's run with --no-periodic)."""
    r = client()
    job_started(r, "tick")
    job_done(r, "tick")


@unique_task(unique_run_lease=1.0, unique_lock_autoexpire=600, concurrency_limit=1)
def one_at_a_time(name: str) -> str:
    """One concurrency slot for the task: the other calls park, and are enqueued into Huey in turn."""
    return _gated(name)


def _versioned(name: str, version: int, *, gated: bool = True) -> int:
    """Record ``version`` in ``versions:NAME``, then run as a gated task does (waiting at ``NAME``)."""
    r = client()
    r.rpush(f"versions:{name}", version)
    job_started(r, name)
    if gated:
        wait_for_gate(r, name)
    job_done(r, name)
    return version


_coalescing = {"unique_args": ("name",), "unique_run_lease": 1.0, "unique_lock_autoexpire": 600}


@unique_task(unique_on_conflict="keep_last", **_coalescing)
def latest(name: str, version: int) -> int:
    """keep_last: calls of one name coalesce, the latest version wins; each run waits at its gate."""
    return _versioned(name, version)


@unique_task(unique_on_conflict="replace", **_coalescing)
def replaced(name: str, version: int) -> int:
    """replace: a call while one is queued takes its place (the queued task is revoked)."""
    return _versioned(name, version)


@unique_task(unique_debounce=1.0, **_coalescing)
def debounced(name: str, version: int) -> int:
    """Runs a second after the last call of its name, with that call's version."""
    return _versioned(name, version, gated=False)


@unique_task(unique_on_conflict="use_existing", unique_run_lease=1.0, unique_lock_autoexpire=600)
def existing(name: str) -> str:
    """use_existing: a duplicate gets the Result of the task already on its way."""
    return _gated(name)


@unique_task(unique_on_conflict="keep_last", retries=1, retry_delay=2, **_coalescing)
def latest_or_retry(name: str, version: int) -> int:
    """keep_last, and version 0 fails (retried once, two seconds later)."""
    if _versioned(name, version) == 0:
        raise RuntimeError("version 0 fails")
    return version
