"""A Celery app with unique tasks, imported by the test process and by the ``celery worker`` processes.

The broker is the test Redis (``UNIQJOB_TEST_REDIS_URL``); the test process sets
``app.conf.broker_url`` itself, since the URL is known only once the session's
redis-server is up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import task_prerun

from tests.integration_workers import (
    URL_VAR,
    client,
    job_done,
    job_started,
    pretend_other_host,
    wait_for_gate,
)
from uniqjob.integrations.celery import UniqueTask

pretend_other_host()

QUEUE = "uniqjob-test"
#: Seconds before Redis hands an unacknowledged message to another worker (set low for the crash test).
VISIBILITY_VAR = "UNIQJOB_TEST_VISIBILITY"
#: Set (to anything) in a worker's environment to keep task results in the test Redis.
RESULTS_VAR = "UNIQJOB_TEST_RESULTS"

app = Celery("tests.celery_app", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get(URL_VAR),
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get(VISIBILITY_VAR, "3600")),
        "unacked_restore_interval": 1,  # look for abandoned messages every second
        "unacked_restore_throttle": 1,
    },
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)
if os.environ.get(RESULTS_VAR):  # a test that waits for results (use_existing) keeps them in the test Redis
    app.conf.result_backend = os.environ.get(URL_VAR)


def unique_task(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@app.task(base=UniqueTask, **options)`` on this app only, typed loosely (celery has no types)."""
    decorator: Callable[[Callable[..., Any]], Any] = app.task(base=UniqueTask, shared=False, **options)
    return decorator


def _gated(name: str) -> str:
    r = client()
    job_started(r, name)
    wait_for_gate(r, name)
    job_done(r, name)
    return name


@unique_task(unique_run_lease=1.0)
def gate(name: str) -> str:
    """Starts, then waits until the test opens its gate."""
    return _gated(name)


@unique_task()
def slow_gate(name: str) -> str:
    """Like gate, with the default run lease (30 s): a dead holder's lock lapses only that late."""
    return _gated(name)


@unique_task(acks_late=True, unique_run_lease=5.0)
def late_gate(name: str) -> str:
    """Like gate, acknowledged only when done: a worker crash leaves it to be delivered again."""
    return _gated(name)


@unique_task(acks_late=True, reject_on_worker_lost=True, unique_run_lease=5.0)
def requeued_gate(name: str) -> str:
    """Like late_gate, and put back in the queue if its pool child dies: run again by the same worker."""
    return _gated(name)


@unique_task(bind=True, max_retries=2, unique_run_lease=2.0)
def flaky(self: UniqueTask, name: str, failures: int, gated: bool = True) -> int:
    """Retries (a second later) its first ``failures`` attempts; gives up after two retries."""
    r = client()
    attempt = job_started(r, name)
    if gated:
        wait_for_gate(r, f"{name}:{attempt}")
    if attempt <= failures:
        raise self.retry(countdown=1)
    job_done(r, name)
    return attempt


@task_prerun.connect  # type: ignore[untyped-decorator]
def _hold_a_gated_retry(task: Any = None, args: Any = (), **_: Any) -> None:
    """A retry of a gated ``flaky`` waits at gate ``NAME:retry``, before its run lock is taken.

    So a test sees the lock between two attempts (queued, no run lock) for as long as it
    looks, however loaded the machine: not only during the retry's one-second countdown.
    """
    if getattr(task, "name", None) == flaky.name and task.request.retries and (len(args) < 3 or args[2]):
        wait_for_gate(client(), f"{args[0]}:retry")


@unique_task(unique_on_conflict="reschedule", unique_reschedule_delay=1.0)
def rescheduled(name: str) -> str:
    """A duplicate tries again a second later instead of being dropped."""
    return _gated(name)


@unique_task(concurrency_limit=1, concurrency_on_conflict="block")
def one_at_a_time(name: str) -> str:
    """One concurrency slot for the task: the others park, and are published in turn."""
    return _gated(name)


@unique_task(concurrency_limit=2, unique_run_lease=1.0)
def pair(name: str) -> str:
    """Two concurrency slots for the task (15 minutes' lease each): the others park."""
    return _gated(name)


@unique_task(unique_strategy="until_expired", unique_lock_autoexpire=3)
def once_a_while(name: str) -> str:
    """Locked from delay() until 3 s later, however soon it ran."""
    return _gated(name)


def order_of(order_id: int, step: str) -> str:
    """A plain function as a task's concurrency key: one semaphore per order."""
    return f"order-{order_id}"


@unique_task(concurrency_limit=1, concurrency_key=order_of, concurrency_on_conflict="discard")
def order_step(order_id: int, step: str) -> str:
    """One step per order at a time, whatever the step; the others are dropped."""
    return f"{step} of {order_id}"


@unique_task(unique_lock_autoexpire=10)
def expiring(name: str) -> str:
    """A queue lock that expires 10 s after enqueue (plus any countdown)."""
    return name


@unique_task()
def echo(value: int) -> int:
    return value


class Export(UniqueTask):
    """A class-based task: one export per account at a time, duplicates raise."""

    name = "tests.celery_app.Export"
    unique_on_conflict = "raise"
    unique_args = ("account_id",)

    def run(self, account_id: int, note: str = "") -> int:
        return account_id


export = app.register_task(Export())


def _versioned(name: str, version: int) -> int:
    client().rpush(f"versions:{name}", version)
    _gated(name)
    return version


@unique_task(unique_on_conflict="keep_last", unique_args=("name",), unique_run_lease=2.0)
def latest(name: str, version: int) -> int:
    """keep_last: calls of one name coalesce, the latest version wins; each run waits at the gate ``name``."""
    return _versioned(name, version)


@unique_task(unique_on_conflict="replace", unique_args=("name",), unique_run_lease=2.0)
def replaced(name: str, version: int) -> int:
    """replace: a call while one is queued takes its place."""
    return _versioned(name, version)


@unique_task(unique_debounce=1.0, unique_args=("name",), unique_run_lease=2.0)
def debounced(name: str, version: int) -> int:
    """Runs a second after the last call of its name, with that call's version."""
    return _versioned(name, version)
