"""Dramatiq integration: unique actors with ``@dramatiq.actor(unique=True)``; docs/dramatiq.md has the rules.

::

    broker.add_middleware(UniqueMiddleware())

    @dramatiq.actor(unique=True, unique_lock_autoexpire=3600)
    def export(account_id: int) -> None: ...

    export.send(42)   # takes the queue lock, then enqueues; None for a duplicate

The lock's key and token travel in the message's options; the worker runs the
actor's function under that lock. A retry keeps it (and a concurrency slot);
success, and a message that will never run again (dead-lettered, skipped),
release them. The settings live on :func:`job_of` ``(actor)``. Dramatiq cannot
prove a queued message gone (a flushed queue): its lock is kept until
``unique_lock_autoexpire``, which unique actors should therefore set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, ClassVar, Literal

try:
    from dramatiq import Actor, Broker, Message, Middleware
    from dramatiq.errors import ActorNotFound
    from dramatiq.message import generate_unique_id
    from dramatiq.middleware import MiddlewareError
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.dramatiq needs dramatiq ({exc.name} is missing):"
        " pip install 'uniqjob[dramatiq]'",
        name=exc.name,
    ) from exc

from .. import _percall
from .._names import ALL_SETTINGS
from ..errors import ConfigurationError
from ..functions import _CALLABLES
from ..job import Queue, UniqueJob
from ..joblock import JobLock
from . import HEADER, SETTING_PREFIXES, Ticket, in_context, perform, release_gone, settle

__all__ = ["AGAIN", "ActorConfigurationError", "ActorJob", "DramatiqQueue", "UniqueMiddleware", "job_of"]

#: The message option of a rescheduled call's next try (policy "reschedule"): enqueue it again.
AGAIN = "uniqjob_again"
#: Why an actor takes no "replace" (docs/dramatiq.md, "Conflict policies").
NO_REPLACE = (
    "unique_on_conflict 'replace' takes the queued message out of its queue, and Dramatiq cannot remove"
    " a message once it is sent (it has no cancel); 'keep_last' runs the queued message with the latest"
    " call's arguments instead"
)


class ActorConfigurationError(ConfigurationError, MiddlewareError):
    """A unique actor's bad option: a ConfigurationError that Dramatiq lets through its declaration."""


class ActorJob(UniqueJob, abstract=True):
    """Base of the :class:`UniqueJob` made for each unique actor: its settings, keys and locks."""

    #: The actor this job stands for.
    actor: ClassVar[Actor[Any, Any]]

    @classmethod
    def job_name(cls) -> str:
        """``module.actor_name``, which starts the actor's keys."""
        return f"{cls.__module__}.{cls.actor.actor_name}"


def job_of(actor: Actor[Any, Any]) -> type[ActorJob]:
    """The UniqueJob of a unique actor: ``job_of(export).lock_key(42)``, ``job_of(export).is_locked(42)``."""
    job: type[ActorJob] | None = getattr(actor, "unique_job", None)
    if job is None:
        raise ConfigurationError(f"actor {actor.actor_name!r} is not unique: declare it with unique=True")
    return job


@dataclass
class _Call:
    """A ``send_with_options`` on its way through ``UniqueJob.enqueue`` to :meth:`DramatiqQueue.push`."""

    job: type[UniqueJob]
    options: dict[str, Any]
    delay: int | None  # milliseconds
    used: bool = False  # pushed: any later push in this context is another call's (a promotion)


_calls: ContextVar[_Call | None] = ContextVar("uniqjob_dramatiq_call", default=None)


class DramatiqQueue(Queue):
    """A unique actor's queue: its broker (every unique actor has one; no need to make it)."""

    #: Message ids are chosen before the claim, which records them. Dramatiq cannot tell a
    #: lost message (:attr:`proves_jobs_gone` is False): nothing is ever asked.
    suspect_after: float | None = 60.0

    def __init__(self, actor: Actor[Any, Any]) -> None:
        self.actor = actor

    def __repr__(self) -> str:
        return f"DramatiqQueue({self.actor.actor_name!r})"

    def _call(self) -> _Call | None:
        """The send of this actor being enqueued in this context, if any."""
        call = _calls.get()
        if call is None or call.used or _percall.origin(call.job).unique_queue is not self:
            return None
        return call

    def new_job_id(self) -> str:
        """The Dramatiq message id the message will have."""
        return generate_unique_id()

    def pending_delay(self) -> float:
        """Seconds until the message being sent is due: its ``delay`` (0 if none)."""
        call = self._call()
        return (call.delay or 0) / 1000 if call is not None else 0.0

    def push(
        self,
        job_cls: type[UniqueJob],
        lock: JobLock,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Message[Any]:
        """Enqueue the actor's message, with the lock's key and token in its options; return it.

        ``delay``: seconds until it is due, instead of the send's ``delay`` (see :meth:`push_in`).
        """
        call = self._call()
        options: dict[str, Any] = {}
        ms = None
        if call is not None:
            call.used = True
            options, ms = call.options, call.delay
        if delay is not None:
            ms = round(max(delay, 0.0) * 1000) or None
        message = self.actor.message_with_options(args=args, kwargs=kwargs, **options)
        ticket = {HEADER: Ticket(lock.key, lock.token).dump()}
        message = message.copy(message_id=lock.meta.job_id or message.message_id, options=ticket)
        return self.actor.broker.enqueue(message, delay=ms)

    #: :meth:`push`, the message ``delay`` seconds later (``unique_debounce``; a delay queue).
    push_in = push

    def handle(self, job_id: str) -> Message[Any]:
        """The actor's message ``job_id``, as a Message whose ``get_result()`` reads its result
        (with the ``Results`` middleware), made without a round trip (policy "use_existing")."""
        actor = self.actor
        return Message(actor.queue_name, actor.actor_name, (), {}, {}, message_id=job_id)

    def push_later(
        self, job_cls: type[UniqueJob], args: tuple[Any, ...], kwargs: dict[str, Any], delay: float
    ) -> Message[Any]:
        """Enqueue a message of the actor, ``delay`` seconds later, that sends the call again."""
        message = self.actor.message_with_options(args=args, kwargs=kwargs, **{AGAIN: True})
        return self.actor.broker.enqueue(message, delay=round(delay * 1000) if delay > 0 else None)


@dataclass
class _Delivery:
    """One message of a unique actor being processed by this worker thread."""

    message: Any  # dramatiq's MessageProxy
    job: type[ActorJob]
    lock: JobLock | None = None  # made as the actor's function starts
    # "running"; "done" (released, or skipped); "kept" (queued, for a retry that may come);
    # "retried" (a retry was sent)
    state: Literal["running", "done", "kept", "retried"] = "running"

    def decide(self, exc: BaseException | None, result: Any) -> float | None:
        """Released at once when the function returned; kept, queued, after it raised (a retry may come).

        Dramatiq decides about the retry after the function ends: the retry's
        send settles the lock again (:meth:`UniqueMiddleware.before_enqueue`),
        and a message that is acked or dead-lettered without one releases it.
        """
        if exc is None:
            self.state = "done"
            return None
        self.state = "kept"
        return 0.0


_current: ContextVar[_Delivery | None] = ContextVar("uniqjob_dramatiq_delivery", default=None)


def _same(delivery: _Delivery, message: Any) -> bool:
    """True if ``message`` is the delivery's (or a copy of it: its retry)."""
    return bool(delivery.message.message_id == message.message_id)


class UniqueMiddleware(Middleware):
    """Makes actors declared with ``unique=True`` unique: ``broker.add_middleware(UniqueMiddleware())``."""

    @property
    def actor_options(self) -> Any:  # (a set, where Dramatiq's base says so: see _Options)
        """``unique``, and any ``unique_*`` or ``concurrency_*`` name (a wrong one is named when declared)."""
        return _Options()

    def before_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        """Make the actor unique if it says so: its job class, its send, its function."""
        try:
            job = _job_for(actor)
        except ConfigurationError as exc:
            raise ActorConfigurationError(f"actor {actor.actor_name!r}: {exc}") from None
        if job is None:
            return
        setattr(actor, "unique_job", job)  # noqa: B010 - where job_of() and a parked call's path find it
        actor.fn = _unique_fn(job, actor.fn)
        # an instance attribute: send() calls self.send_with_options
        setattr(actor, "send_with_options", functools.partial(_send, actor))  # noqa: B010

    def before_process_message(self, broker: Broker, message: Any) -> None:
        """A unique actor's message is starting: its lock is taken as the actor's function starts."""
        job = _job_of(broker, message)
        _current.set(None if job is None else _Delivery(message, job))

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """The message being processed is sent again (a retry): keep its lock, queued, until it is due."""
        delivery = _current.get()
        if delivery is None or delivery.lock is None or not _same(delivery, message):
            return
        if delivery.state == "kept" and delay:
            settle(delivery.lock, delay / 1000)  # queued since the function raised: now for its delay too

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """The retry is sent: it holds the lock from here on."""
        delivery = _current.get()
        if delivery is not None and delivery.state == "kept" and _same(delivery, message):
            delivery.state = "retried"

    def after_ack(self, broker: Broker, message: Any) -> None:
        """Done with the message (or, as ``after_nack``, dead-lettered: out of retries, ``throws``,
        ``max_age``...; it never runs again): release its lock unless a retry holds it."""
        delivery = _current.get()
        if delivery is not None and _same(delivery, message):
            _current.set(None)
            if delivery.lock is not None:
                if delivery.state in ("running", "kept"):  # no retry came: done for good
                    release_gone(delivery.job, delivery.lock, message.args, message.kwargs)
                return
        elif "eta" in message.options:
            return  # a delayed message moved to its queue: it runs later
        # Acked or dead-lettered before the actor's function started (``max_age``, a middleware's skip).
        job = _job_of(broker, message)
        data = message.options.get(HEADER)
        if job is not None and data is not None:
            lock = Ticket.load(data, f"Dramatiq message {message.message_id}").lock(job)
            release_gone(job, lock, message.args, message.kwargs)

    after_nack = after_ack


class _Options:
    """What the middleware adds to a broker's ``actor_options``: a set that also lets through, for
    the middleware to check when the actor is declared, any ``unique_*`` / ``concurrency_*`` name.

    Dramatiq refuses an actor option no middleware names with "Did you forget to add a
    middleware?": a misspelt setting (``unique_on_conflit``) is named here instead, with the
    name meant. ``broker.actor_options |= middleware.actor_options`` makes the broker's set a
    :class:`_Settings` (this is no set: ``|=`` then falls back to ``__ror__``).
    """

    def __ror__(self, names: set[str]) -> set[str]:
        return _Settings(names | {"unique"} | ALL_SETTINGS)


class _Settings(set[str]):
    """A broker's ``actor_options`` that does not count ``unique_*`` / ``concurrency_*`` names as unknown."""

    def __rsub__(self, given: Iterable[str]) -> set[str]:  # Dramatiq: set(options) - actor_options
        return {name for name in given if name not in self and not name.startswith(SETTING_PREFIXES)}


def _job_for(actor: Actor[Any, Any]) -> type[ActorJob] | None:
    """The UniqueJob of an actor declared with ``unique=True`` (None for another actor)."""
    options = actor.options
    names = sorted(name for name in options if name.startswith(SETTING_PREFIXES))
    unique = options.get("unique", False)
    if not isinstance(unique, bool):
        raise ConfigurationError(f"unique must be True or False, got {unique!r}")
    if not unique:
        if names:
            raise ConfigurationError(f"{names[0]} needs unique=True")
        return None
    if "unique_queue" in names:
        raise ConfigurationError("a unique actor's queue is Dramatiq's: choose it with queue_name=...")
    if options.get("unique_on_conflict") == "replace":
        raise ConfigurationError(NO_REPLACE)
    fn = actor.fn
    namespace: dict[str, Any] = {
        name: staticmethod(options[name]) if name in _CALLABLES and callable(options[name]) else options[name]
        for name in names
    }
    namespace.update(
        __module__=fn.__module__,
        # importable by that path (a parked call names its job class, see uniqjob.concurrency)
        __qualname__=f"{fn.__qualname__}.unique_job",
        __doc__=f"The uniqjob settings, keys and locks of Dramatiq actor {actor.actor_name}.",
        actor=actor,
        perform=staticmethod(fn),
        unique_queue=DramatiqQueue(actor),
    )
    return type(actor.actor_name, (ActorJob,), namespace)


def _job_of(broker: Broker, message: Any) -> type[ActorJob] | None:
    """The UniqueJob of the message's actor, or None if it is not a unique actor of this broker."""
    try:
        actor = broker.get_actor(message.actor_name)
    except ActorNotFound:
        return None
    return getattr(actor, "unique_job", None)


def _send(
    actor: Actor[Any, Any],
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    delay: timedelta | int | None = None,
    **options: Any,
) -> Any:
    """A unique actor's ``send_with_options``: the Message, None for a duplicate the policy drops.

    ``unique_*`` options are uniqjob settings for this send (``unique_on_conflict``,
    ``unique_lock_autoexpire``, ``unique_reschedule_delay``), checked, applied, and not
    put in the message; any other ``unique_*`` or ``concurrency_*`` one is a
    ConfigurationError naming it. Over a concurrency limit under "block": a ``Parked``.
    """
    settings = {name: options.pop(name) for name in list(options) if name.startswith(SETTING_PREFIXES)}
    if settings.get("unique_on_conflict") == "replace":
        raise ConfigurationError(f"{actor.actor_name}.send_with_options(): {NO_REPLACE}")
    job = _percall.using(
        job_of(actor), settings, prefix="unique_", where=f"{actor.actor_name}.send_with_options()"
    )
    if isinstance(delay, timedelta):
        delay = int(delay.total_seconds() * 1000)
    with in_context(_calls, _Call(job, options, delay)):
        return job.enqueue(*args, **(kwargs or {}))


def _unique_fn(job: type[ActorJob], fn: Callable[..., Any]) -> Callable[..., Any]:
    """The actor's function as the worker calls it: under the lock of the message being processed."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        delivery = _current.get()
        if delivery is None or delivery.job is not job or delivery.lock is not None:
            return fn(*args, **kwargs)  # called as a function, in place: no lock (as Dramatiq runs it)
        message = delivery.message
        if message.options.get(AGAIN):  # a rescheduled call's next try: send it again
            delivery.state = "done"
            job.enqueue(*args, **kwargs)
            return None
        delivery.lock = lock = _lock_of(job, message)
        result = perform(job, lock, args, kwargs, delivery.decide)
        delivery.state = "done"  # released, or skipped (a duplicate at execution time)
        return result

    return run


def _lock_of(job: type[ActorJob], message: Any) -> JobLock:
    """The lock a message carries; a message sent around uniqjob (``broker.enqueue``, a pipeline)
    is locked by its arguments, taking over a queued lock of the same call."""
    data = message.options.get(HEADER)
    if data is not None:
        return Ticket.load(data, f"Dramatiq message {message.message_id}").lock(job, message.message_id)
    lock = job.lock(*message.args, **message.kwargs)
    lock.adopt = True
    lock.meta = replace(lock.meta, job_id=message.message_id)
    return lock
