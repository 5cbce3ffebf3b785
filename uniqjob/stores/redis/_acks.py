"""Replica acknowledgement of grants, shared by both Redis stores (``replicas=N``).

A step that grants a lock or a slot is sent with ``WAIT N timeout_ms`` behind
it on the same connection, one pipeline (:meth:`Wire.acked
<uniqjob.stores.redis._wire.Wire.acked>`). Redis replicates asynchronously:
a grant the master has not yet passed on is lost if the master dies and a
replica takes its place, and the key is then free for a second holder. A
grant acknowledged by ``N`` replicas survives the promotion of any of them.
One that too few acknowledged within ``replica_timeout`` is undone on the
master, token-checked, and the call fails closed with
:class:`~uniqjob.errors.BackendError`.

What waits: the lock store's claim and start, the semaphore store's acquire
and start (each grants its caller), a release that promotes a parked call (a
grant to another), and both stores' lease renewals (a renewal the replicas
did not see must not count as confirmed: the holder would trust a lease that
a promoted replica ends sooner; it is not undone, only refused). What does
not: ``attach`` (a job id recorded in a lock already held: lost, the lock is
only harder to prove gone), ``requeue`` (a held key turned back to queued
for its retry under the same token: no new holder; lost, the old state lapses
with its lease), and reaps and drops, whose promotions, like every queue
promotion, are held by their promoter until handed and then started, and the
start waits.

Why ``WAIT`` and not ``WAITAOF``: docs/redis.md.

:meth:`Acks.confirm` applies the rules with plain calls (the sync stores);
the asyncio face (``_async.RedisAsync``) awaits the same two steps, the count
of replicas and the undo, and words its error with the same methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import BackendError, ConfigurationError
from ._wire import Wire

__all__ = ["WAIT_HEADROOM", "Acks", "check_wait", "claimed", "coalesced", "if_one", "started"]


class Acks:
    """The replicas a grant must reach (``replicas``, within ``timeout`` seconds) and how to judge a count."""

    def __init__(self, wire: Wire, replicas: int, timeout: float) -> None:
        self.wire = wire
        self.replicas = replicas
        self.timeout = timeout
        #: ``WAIT replicas timeout_ms``'s arguments (WAIT's timeout 0 would block for ever).
        self.wait = (replicas, max(1, round(timeout * 1000)))

    def short(self, acked: int | Exception) -> bool:
        """Whether ``acked`` (``WAIT``'s count, or its error) falls short of ``replicas``."""
        return isinstance(acked, Exception) or acked < self.replicas

    def told(self, acked: int | Exception, what: str, connected: int | None = None) -> str:
        """What happened to ``what`` (a grant ``acked`` fell short for): the start of the error's text.

        ``connected``: how many replicas the master has connected (``INFO replication``,
        asked only for a count too low), 0 after a failover that left it without one.
        """
        if isinstance(acked, Exception):
            return f"{what} on the master but the wait for {self.replicas} replicas failed ({acked})"
        master = "the master"
        if connected is not None:
            master += f" (which has {connected} replica{'' if connected == 1 else 's'} connected)"
        told = f"{what} on {master} but acknowledged by {acked} of {self.replicas} replicas"
        return f"{told} within {self.timeout}s"

    @staticmethod
    def refused(
        told: str, owner: object, store: str, undo: Exception | None = None, *, undone: bool
    ) -> BackendError:
        """The error a short grant fails with: not confirmed (nothing to undo), undone, or its undo failed."""
        if undo is not None:
            told += f", and undoing it failed too ({undo.__cause__ or undo}): "
            return BackendError(f"{told}it stays on the master until undone or lapsed ({owner!r})", store)
        return BackendError(f"{told}; {'undone' if undone else 'not confirmed'} ({owner!r})", store)

    def confirm(
        self,
        acked: int | Exception,
        what: str,
        undo: Callable[[], object] | None,
        owner: object,
        store: str,
        *,
        name: Any,
    ) -> None:
        """Raise BackendError (naming ``owner``, the store) if fewer than ``replicas`` acknowledged ``what``.

        Before it is raised, ``undo`` (if any) removes, token-checked, only what the call
        granted; if it fails too, the error says so: what was granted then stays on the
        master until it is undone later or lapses. A count too low also says how many replicas
        the master of ``name`` (the first Redis key the script touched) has connected.
        """
        if not self.short(acked):
            return
        connected = None if isinstance(acked, Exception) else self.wire.connected_replicas(name)
        told = self.told(acked, what, connected)
        if undo is None:
            raise self.refused(told, owner, store, undone=False)
        try:
            undo()
        except Exception as exc:
            raise self.refused(told, owner, store, exc, undone=False) from exc
        raise self.refused(told, owner, store, undone=True)


#: How much longer than ``replica_timeout`` the socket timeout must be: WAIT replies once its
#: timeout is up, and the reply must then still cross the network in time.
WAIT_HEADROOM = 0.5


def check_wait(client: Any, replica_timeout: float) -> None:
    """Refuse a ``replica_timeout`` the client's socket timeout would cut short (WAIT replies after it).

    The socket timeout is the pool's (one server, a Sentinel master) or the one every
    cluster node's connections get (a cluster client's nodes manager); it must exceed
    ``replica_timeout`` by :data:`WAIT_HEADROOM`.
    """
    pool = getattr(client, "connection_pool", None) or getattr(client, "nodes_manager", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    limit = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    if isinstance(limit, int | float) and limit < replica_timeout + WAIT_HEADROOM:
        raise ConfigurationError(
            f"replica_timeout ({replica_timeout}s) must be shorter than the client's socket timeout "
            f"({limit}s) by at least {WAIT_HEADROOM}s: the wait for replicas would time out the "
            "connection instead"
        )


# What a lock script's reply granted, for Acks.confirm ("": nothing to acknowledge).


def claimed(key: str, run: bool, reply: Any) -> str:
    """What a CLAIM ``reply`` wrote of ``key`` that replicas must acknowledge (an integer: granted;
    'R': replaced, the key is the caller's now; a call coalesced into another's lock: its
    arguments, which a promoted replica without them would lose), else "" (a conflict's snapshot)."""
    if type(reply) is int:
        return f"the {'queue and run locks' if run else 'queue lock'} of {key!r}, granted"
    head = reply[:1] if isinstance(reply, (str, bytes)) else ""
    if head in ("R", b"R"):
        return f"the queue lock of {key!r}, replaced"
    if coalesced(reply):
        return f"the latest call's arguments of {key!r}, kept"
    return ""


def coalesced(reply: Any) -> bool:
    """Whether a CLAIM ``reply`` says the call was coalesced into another's lock ("keep_last": into the
    queued call, 'l' or 'L'; as the pending call behind a running one, 'P')."""
    return isinstance(reply, (str, bytes)) and reply[:1] in ("l", "L", "P", b"l", b"L", b"P")


def started(key: str, reply: Any) -> str:
    """What a START ``reply`` granted of ``key`` (an integer or a list: granted), else "" (a snapshot)."""
    return f"the run lock of {key!r}, granted" if type(reply) in (int, list) else ""


def if_one(what: str, reply: Any) -> str:
    return what if reply == 1 else ""
