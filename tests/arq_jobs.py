"""Job classes on arq queues, imported by the test process and by the ``arq`` worker processes."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

import redis
from arq import Retry
from arq.connections import RedisSettings

from tests.integration_workers import JOB_TIMEOUT, URL_VAR, client, job_done, job_started, pretend_other_host
from uniqjob import UniqueJob
from uniqjob.integrations.arq import FUNCTIONS, ArqQueue
from uniqjob.settings import ConflictPolicy

pretend_other_host()

QUEUE = "uniqjob-test-arq"


def settings() -> RedisSettings:
    """The arq connection of the tests, to the test Redis (made on first use: the URL is known late)."""
    return RedisSettings.from_dsn(os.environ.get(URL_VAR, "redis://127.0.0.1:1/0"))


queue = ArqQueue(settings, queue_name=QUEUE)


async def wait_for_gate(r: redis.Redis, gate: str) -> None:
    """Wait, without blocking the worker's loop, until the test opens ``gate``; fail after JOB_TIMEOUT."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not r.exists(f"go:{gate}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate!r} never opened")
        await asyncio.sleep(0.01)


class Gate(UniqueJob):
    """Starts, then waits until the test opens its gate."""

    unique_queue = queue
    unique_run_lease = 1.0

    async def perform(self, name: str) -> str:
        r = client()
        job_started(r, name)
        await wait_for_gate(r, name)
        job_done(r, name)
        return name


class Flaky(UniqueJob):
    """Asks arq for a retry (``Retry``) on its first ``retries`` attempts, each gated."""

    unique_queue = queue
    unique_run_lease = 2.0

    async def perform(self, name: str, retries: int) -> int:
        r = client()
        attempt = job_started(r, name)
        await wait_for_gate(r, f"{name}:{attempt}")
        if attempt <= retries:
            raise Retry(defer=0.2)
        job_done(r, name)
        return attempt


class Failing(UniqueJob):
    """Fails for good (an ordinary exception: arq does not retry it)."""

    unique_queue = queue

    async def perform(self, name: str) -> None:
        job_started(client(), name)
        raise RuntimeError(f"{name} fails")


class Expiring(UniqueJob):
    """A job arq drops if no worker starts it within a second (arq's ``_expires``)."""

    unique_queue = ArqQueue(settings, queue_name=QUEUE, expires=1.0)

    async def perform(self, name: str) -> None:
        job_started(client(), name)


class Rescheduled(UniqueJob):
    """A duplicate comes back through arq a moment later."""

    unique_queue = queue
    unique_on_conflict = "reschedule"
    unique_reschedule_delay = 0.2

    async def perform(self, name: str) -> str:
        r = client()
        attempt = job_started(r, name)
        await wait_for_gate(r, f"{name}:{attempt}")
        return name


async def running(r: redis.Redis, name: str, key: str, gate: str) -> None:
    """Count job ``name`` running under ``key`` while it waits at ``gate``; counts go to ``peaks:key``."""
    now = r.incr(f"running:{key}")
    r.rpush(f"peaks:{key}", now)
    try:
        job_started(r, name)
        await wait_for_gate(r, gate)
        job_done(r, name)
    finally:
        r.decr(f"running:{key}")


class Limited(UniqueJob):
    """One at a time per group (``concurrency_limit``, "block"): a call over it parks until a slot frees."""

    unique_queue = queue
    unique_run_lease = 1.0
    concurrency_limit = 1
    concurrency_duration = 2.0

    @classmethod
    def concurrency_key(cls, group: str, name: str) -> str:
        return group

    async def perform(self, group: str, name: str) -> str:
        await running(client(), name, group, name)
        return name


class LimitedFlaky(Limited):
    """Limited, and asks arq for a retry on its first attempt: the retry keeps the slot."""

    async def perform(self, group: str, name: str) -> str:
        r = client()
        attempt = job_started(r, name)
        await wait_for_gate(r, f"{name}:{attempt}")
        if attempt == 1:
            raise Retry(defer=0.2)
        job_done(r, name)
        return name


class LimitedRaise(Limited):
    """At the limit, ``aenqueue`` raises ConcurrencyLimitExceeded (its slot is taken at enqueue)."""

    concurrency_on_conflict = "raise"


class LimitedDiscard(Limited):
    """At the limit, ``aenqueue`` drops the call: None, logged."""

    concurrency_on_conflict = "discard"


class Latest(UniqueJob):
    """keep_last: calls of one name coalesce, the latest version wins; each run waits at the gate ``name``."""

    unique_queue = queue
    unique_on_conflict: ClassVar[ConflictPolicy] = "keep_last"
    unique_args = ("name",)
    unique_run_lease = 2.0

    async def perform(self, name: str, version: int) -> int:
        r = client()
        r.rpush(f"versions:{name}", version)
        job_started(r, name)
        await wait_for_gate(r, name)
        job_done(r, name)
        return version


class Replaced(Latest):
    """replace: a call while one is queued takes its place."""

    unique_on_conflict = "replace"


class Debounced(Latest):
    """Runs a second after the last call of its name, with that call's version."""

    unique_debounce = 1.0



class WorkerSettings:
    """``arq tests.arq_jobs.WorkerSettings``: a plain arq worker on the test queue."""

    functions: ClassVar[list[Any]] = [*FUNCTIONS]
    redis_settings = settings()
    queue_name = QUEUE
    max_tries = 3
    poll_delay = 0.05
