"""arq integration: unique jobs on arq queues, run by a plain arq worker; docs/arq.md has the rules.

::

    class SendReport(UniqueJob):
        unique_queue = ArqQueue(RedisSettings(host="redis"))

        async def perform(self, account_id: int) -> None: ...

    await SendReport.aenqueue(42)   # takes the lock, then enqueues into arq; None for a duplicate

    class WorkerSettings:
        functions = [*uniqjob.integrations.arq.FUNCTIONS, ...]

arq runs :func:`run_job`, which reads the lock's key and token from the job
(never recomputed from the arguments) and keeps the lock, queued, while arq
means to run the job again (:class:`arq.Retry`, a worker shut down mid-job).
The queue lock records the arq job id, so a later enqueue reclaims a lock
whose job arq has finished or will never run (:meth:`ArqQueue.job_gone`).
A call parked behind a concurrency limit is enqueued into arq by the worker
that frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from arq import ArqRedis, Retry, create_pool
    from arq.connections import RedisSettings
    from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
    from arq.jobs import Job
    from arq.worker import Function, func
except ModuleNotFoundError as exc:  # the optional extra (beside celery: see docs/arq.md)
    raise ModuleNotFoundError(
        f"uniqjob.integrations.arq needs arq ({exc.name} is missing): pip install 'uniqjob[arq]'"
        " (beside uniqjob[celery], see docs/arq.md)",
        name=exc.name,
    ) from exc

from .. import _percall
from ..errors import BackendError, ConfigurationError
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from ..stores._log import get_logger
from . import HEADER, Decision, Ticket, aperform, job_ref, resolve_job

__all__ = ["AGAIN", "FUNCTIONS", "RUN", "ArqQueue", "enqueue_again", "enqueue_call", "run_job"]

log = get_logger(__name__)

#: The name of :func:`run_job` in arq (what a pushed job calls).
RUN = "uniqjob.run_job"
#: The name of :func:`enqueue_again` in arq (a rescheduled duplicate's second try).
AGAIN = "uniqjob.enqueue_again"

Source = RedisSettings | ArqRedis | Callable[[], "RedisSettings | ArqRedis | Awaitable[ArqRedis]"]


class ArqQueue(Queue):
    """An arq queue as a job class's ``unique_queue`` (enqueue through ``await Job.aenqueue(...)``).

    ``redis`` is arq's :class:`RedisSettings`, an :class:`ArqRedis` pool, or a
    function returning either (or a coroutine making a pool), called on first
    use. ``queue_name`` is arq's queue (None: arq's default); ``expires``
    (seconds) drops a job arq has not started by then (arq's ``_expires``),
    and its lock with it, at the next enqueue.
    """

    def __init__(self, redis: Source, *, queue_name: str | None = None, expires: float | None = None) -> None:
        if not (isinstance(redis, RedisSettings | ArqRedis) or callable(redis)):
            raise ConfigurationError(
                f"ArqQueue needs arq RedisSettings, an ArqRedis pool or a function returning one, "
                f"got {redis!r}"
            )
        if expires is not None and not (isinstance(expires, int | float) and expires > 0):
            raise ConfigurationError(f"ArqQueue expires must be a number of seconds > 0, got {expires!r}")
        self.queue_name = queue_name
        self.expires = expires
        self._source = redis
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ArqRedis] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"ArqQueue({self.queue_name or 'arq:queue'!r})"

    async def pool(self) -> ArqRedis:
        """The arq pool of the running event loop (made on first use in it)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            source: Any = self._source
            if callable(source) and not isinstance(source, RedisSettings | ArqRedis):
                source = source()
                if isinstance(source, Awaitable):
                    source = await source
            if isinstance(source, RedisSettings):
                source = await create_pool(source)
            if not isinstance(source, ArqRedis):
                raise ConfigurationError(
                    f"the ArqQueue factory returned {source!r}, not RedisSettings or ArqRedis"
                )
            pool = self._pools[loop] = source
        return pool

    #: Seconds a queued lock is held before a conflicting enqueue asks arq whether its job is
    #: gone (docs/rq.md, "Cost, and is the holder's job gone?": the same rule as RQ's).
    suspect_after: float | None = 60.0

    def new_job_id(self) -> str:
        """Return a fresh arq job id, recorded in the job's queue lock by the claim."""
        return uuid.uuid4().hex

    async def push(  # an async queue: awaited by Job.aenqueue
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Job:
        """Enqueue the job into arq, with its lock's key and token (``delay``: see push_in)."""
        ticket = Ticket(lock.key, lock.token, job_ref(job_cls))
        pool = await self.pool()
        job = await pool.enqueue_job(
            RUN,
            {HEADER: ticket.dump()},
            list(args),
            dict(kwargs),
            _job_id=lock.meta.job_id or None,
            _queue_name=self.queue_name,
            _expires=self.expires,
            _defer_by=delay,
        )
        if job is None:  # arq keeps job ids unique: a fresh one cannot be taken
            raise BackendError(f"arq refused job id {lock.meta.job_id!r}: it is in use", "arq")
        return job

    #: :meth:`push`, the job deferred by ``delay`` seconds (arq's ``_defer_by``; ``unique_debounce``).
    push_in = push

    async def remove(self, job_id: str) -> None:
        """Abort arq job ``job_id`` (policy "replace"; workers with ``allow_abort_jobs`` drop it)."""
        job = await self.handle(job_id)
        with contextlib.suppress(TimeoutError):  # not waited for: its start is refused anyway
            await job.abort(timeout=0)

    async def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Job | None:
        """Have a worker call ``await job_cls.aenqueue(*args, **kwargs)`` in ``delay`` seconds."""
        pool = await self.pool()
        return await pool.enqueue_job(
            AGAIN,
            job_ref(job_cls),
            list(args),
            dict(kwargs),
            _defer_by=max(delay, 0.0),
            _queue_name=self.queue_name,
        )

    async def handle(self, job_id: str) -> Job:
        """The ``arq.jobs.Job`` of ``job_id`` on this queue (policy "use_existing"; no round trip)."""
        pool = await self.pool()
        name = self.queue_name or pool.default_queue_name
        return Job(job_id, pool, _queue_name=name, _deserializer=pool.job_deserializer)

    async def job_gone(self, job_id: str) -> bool:  # type: ignore[override]
        """True if arq has finished job ``job_id`` (its result is kept) or will never run it.

        A job whose data is gone while it is not running will never run: arq drops
        it as "expired" (``_expires``, or its data's own expiry) when it comes up.
        """
        try:
            async with (await self.pool()).pipeline(transaction=False) as pipe:
                pipe.exists(result_key_prefix + job_id)
                pipe.exists(in_progress_key_prefix + job_id)
                pipe.exists(job_key_prefix + job_id)
                finished, running, data = await pipe.execute()
        except Exception:  # when in doubt, never delete
            log.warning("cannot tell whether arq job %s is gone; keeping its lock", job_id, exc_info=True)
            return False
        return bool(finished) or not (running or data)


async def run_job(ctx: dict[str, Any], data: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """What arq workers run for a job of an :class:`ArqQueue`: perform it under the lock it carries."""
    job_id = str(ctx.get("job_id", ""))
    ticket = Ticket.load(data.get(HEADER) if isinstance(data, dict) else None, f"arq job {job_id}")
    job_cls = resolve_job(ticket.job)
    lock = ticket.lock(job_cls, job_id)
    return await aperform(job_cls, lock, list(args), dict(kwargs), decide)


async def enqueue_call(
    job_cls: type[UniqueJob],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """``await job_cls.aenqueue(*args, **kwargs)`` with uniqjob settings for this call.

    ``settings`` are given as Celery's ``apply_async`` and RQ's ``enqueue_call`` take
    them: ``unique_on_conflict``, ``unique_lock_autoexpire``, ``unique_reschedule_delay``
    (``job_cls.using(...)``'s, with the prefix); any other is a ConfigurationError
    naming it. The job's own arguments are ``args`` and ``kwargs``.
    """
    queue = job_cls.unique_queue
    if not isinstance(queue, ArqQueue):
        raise ConfigurationError(f"{job_cls.job_name()}.unique_queue is {queue!r}, not an ArqQueue")
    job = _percall.using(job_cls, settings, prefix="unique_", where="enqueue_call()")
    return await job.aenqueue(*args, **dict(kwargs or {}))


async def enqueue_again(
    ctx: dict[str, Any], ref: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> str | None:
    """A rescheduled call's second try (policy "reschedule"); the new arq job id, None if dropped."""
    job = await resolve_job(ref).aenqueue(*args, **kwargs)
    return job.job_id if isinstance(job, Job) else None


def decide(exc: BaseException | None, result: Any) -> Decision:
    """Seconds until arq runs a job again after this try, or None if it never will.

    arq runs a job again after :class:`arq.Retry` (at its ``defer``) and after a
    cancellation (a worker shutting down mid-job). Should arq then drop the
    job instead (out of tries, aborted, timed out), its lock is freed by the
    next enqueue, which finds the job finished (:meth:`ArqQueue.job_gone`).
    """
    if isinstance(exc, Retry):
        return (exc.defer_score or 0) / 1000
    if isinstance(exc, asyncio.CancelledError):
        return 0.0
    return None


#: The functions an arq worker needs for uniqjob's jobs: ``functions = [*FUNCTIONS, ...]``.
FUNCTIONS: list[Function] = [func(run_job, name=RUN), func(enqueue_again, name=AGAIN)]
