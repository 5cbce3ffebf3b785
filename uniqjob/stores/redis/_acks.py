"""Replica acknowledgement of grants, shared by both Redis stores (``replicas=N``).

A step that grants a lock or a slot is sent with ``WAIT N timeout_ms`` behind
it on the same connection (:meth:`Scripts.acked`). Redis replicates
asynchronously: a grant the master has not yet passed on is lost if the
master dies and a replica takes its place, and the key is then free for a
second holder. A grant acknowledged by ``N`` replicas survives the promotion
of any of them. One that too few acknowledged within ``replica_timeout`` is
undone on the master, token-checked, and the call fails closed with
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

Why ``WAIT`` and not ``WAITAOF``: a failover promotes a replica, and what it
must hold is the grant in memory, which is what ``WAIT`` confirms; ``WAITAOF``
confirms a write to the append-only file (Redis 7.2 and later, and only where
``appendonly`` is on), which protects against a restart, not a failover, and
adds an fsync to every grant.

The rules (what counts as acknowledged, what is undone, what the error says)
are written once, as generators of steps (:meth:`Acks.granting`,
:meth:`Acks.judging`) that *yield* what they need done: ``(RUN, call)`` (send
the call's script with ``WAIT`` behind it; sent back: its reply and the
count), ``(COUNT, name)`` (how many replicas the master of ``name`` has
connected; sent back: an int or None) and ``(UNDO, undo)`` (take the grant
back; an error is thrown in). :meth:`Acks.drive` does each step by calling
it (the sync stores); the asyncio face (``_async.RedisAsync``) awaits it.
Only the sending differs between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from redis.commands.core import Script

from ...errors import BackendError
from ._transport import Scripts, pack

__all__ = ["COUNT", "RUN", "UNDO", "Acks", "Judging", "connected_in"]

#: The steps of an acknowledged grant: send it with WAIT, count the master's replicas, undo it.
RUN, COUNT, UNDO = "run", "count", "undo"

#: Steps of one acknowledged call (``(what, argument)``), sent each answer; returns the call's reply.
Judging = Generator[tuple[str, Any], Any, Any]


class Acks:
    """Run grant scripts with ``WAIT`` behind them, and judge the count of replicas that acknowledged."""

    def __init__(self, scripts: Scripts, replicas: int, timeout: float) -> None:
        self.scripts = scripts
        self.replicas = replicas
        self.timeout = timeout
        self._wait = (replicas, max(1, round(timeout * 1000)))  # WAIT's timeout 0 would block for ever
        #: ``WAIT replicas timeout_ms``, packed: what goes behind a grant's script on its connection.
        self.wait_command = pack(["WAIT", *self._wait])

    def run(self, script: Script, numkeys: int, items: Sequence[Any]) -> tuple[Any, int | Exception]:
        """The script's reply and how many replicas acknowledged it (and every earlier write)."""
        return self.scripts.acked(script, numkeys, items, self._wait)

    def granting(
        self, call: Any, owner: object, store: str, failure: Callable[[Exception, list[Any]], Exception]
    ) -> Judging:
        """The steps of one grant call (``_store.Call``) of ``owner`` to acknowledge; its raw reply.

        ``(RUN, call)`` sends it with ``WAIT`` behind (an error the send raised becomes
        ``failure(exc, keys)``); what the reply granted (``call.grant``), if anything,
        is judged as :meth:`judging` does, with ``call.undo`` (what makes the undo's call).
        """
        try:
            reply, acked = yield RUN, call
        except Exception as exc:
            raise failure(exc, call.items[: call.numkeys]) from exc
        what = call.grant(reply)
        if what:
            yield from self.judging(acked, what, call.undo, owner, store, name=call.items[0])
        return reply

    def judging(
        self,
        acked: int | Exception,
        what: str,
        undo: Any,
        owner: object,
        store: str,
        *,
        name: Any = None,
    ) -> Judging:
        """Raise BackendError (naming ``owner``, the store) if fewer than ``replicas`` acknowledged ``what``.

        Before it is raised, ``undo`` (if any; done by an ``(UNDO, undo)`` step) removes,
        token-checked, only what this call granted. If it fails too, the error says so: what
        was granted then stays on the master until it is undone later or lapses. With
        ``name`` (the first Redis key the script touched), a count too low also says how
        many replicas the master that holds it has connected (a ``(COUNT, name)`` step:
        ``INFO replication``, asked only then): 0 after a failover that left the new
        master without one.
        """
        if isinstance(acked, Exception):
            told = f"{what} on the master but the wait for {self.replicas} replicas failed ({acked})"
        elif acked >= self.replicas:
            return
        else:
            master = "the master" if name is None else _master((yield COUNT, name))
            told = f"{what} on {master} but acknowledged by {acked} of {self.replicas} replicas "
            told += f"within {self.timeout}s"
        if undo is None:
            raise BackendError(f"{told}; not confirmed ({owner!r})", store)
        try:
            yield UNDO, undo
        except Exception as exc:
            told += f", and undoing it failed too ({exc.__cause__ or exc}): "
            told += "it stays on the master until undone or lapsed"
            raise BackendError(f"{told} ({owner!r})", store) from exc
        raise BackendError(f"{told}; undone ({owner!r})", store)

    def check(
        self,
        acked: int | Exception,
        what: str,
        undo: Callable[[], object] | None,
        owner: object,
        store: str,
        *,
        name: Any = None,
    ) -> None:
        """:meth:`judging`, its steps done here: ``undo`` called, the replicas counted by ``scripts``."""
        self.drive(self.judging(acked, what, undo, owner, store, name=name), _called)

    def drive(self, steps: Judging, undo: Callable[[Any], object]) -> Any:
        """Do ``steps`` (the module's docstring) by calling each (an undo: ``undo(arg)``); its result."""
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                what, arg = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            try:
                if what == RUN:
                    reply = self.run(arg.script, arg.numkeys, arg.items)
                elif what == COUNT:
                    reply = self.scripts.connected_replicas(arg)
                else:
                    reply = undo(arg)
                error = None
            except Exception as exc:  # thrown into the steps, where the rules handle it
                reply, error = None, exc


def connected_in(info: Any) -> int | None:
    """How many replicas an ``INFO replication`` reply (its text, or redis-py's dict) says are connected."""
    try:
        if isinstance(info, dict):
            return int(info["connected_slaves"])
        text = info.decode() if isinstance(info, bytes) else str(info)
        line = next(line for line in text.splitlines() if line.startswith("connected_slaves:"))
        return int(line.partition(":")[2])
    except Exception:  # only for a message: None, "cannot be told"
        return None


def _called(undo: Callable[[], object]) -> object:
    return undo()


def _master(connected: int | None) -> str:
    if connected is None:
        return "the master"
    return f"the master (which has {connected} replica{'' if connected == 1 else 's'} connected)"
