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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import Script

from ...errors import BackendError
from ._transport import Scripts

__all__ = ["Acks"]


class Acks:
    """Run grant scripts with ``WAIT`` behind them, and judge the count of replicas that acknowledged."""

    def __init__(self, scripts: Scripts, replicas: int, timeout: float) -> None:
        self.scripts = scripts
        self.replicas = replicas
        self.timeout = timeout
        self._wait = (replicas, max(1, round(timeout * 1000)))  # WAIT's timeout 0 would block for ever

    def run(self, script: Script, numkeys: int, items: Sequence[Any]) -> tuple[Any, int | Exception]:
        """The script's reply and how many replicas acknowledged it (and every earlier write)."""
        return self.scripts.acked(script, numkeys, items, self._wait)

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
        """Raise BackendError (naming ``owner``, the store) if fewer than ``replicas`` acknowledged ``what``.

        Before it is raised, ``undo`` (if any) removes, token-checked, only
        what this call granted. If it fails too, the error says so: what was
        granted then stays on the master until it is undone later or lapses.
        With ``name`` (the first Redis key the script touched), a count too low also says
        how many replicas the master that holds it has connected (``INFO replication``,
        asked only then): 0 after a failover that left the new master without one.
        """
        if isinstance(acked, Exception):
            told = f"{what} on the master but the wait for {self.replicas} replicas failed ({acked})"
        elif acked >= self.replicas:
            return
        else:
            master = "the master" if name is None else _master(self.scripts.connected_replicas(name))
            told = f"{what} on {master} but acknowledged by {acked} of {self.replicas} replicas "
            told += f"within {self.timeout}s"
        if undo is None:
            raise BackendError(f"{told}; not confirmed ({owner!r})", store)
        try:
            undo()
        except Exception as exc:
            told += f", and undoing it failed too ({exc.__cause__ or exc}): "
            told += "it stays on the master until undone or lapsed"
            raise BackendError(f"{told} ({owner!r})", store) from exc
        raise BackendError(f"{told}; undone ({owner!r})", store)


def _master(connected: int | None) -> str:
    if connected is None:
        return "the master"
    return f"the master (which has {connected} replica{'' if connected == 1 else 's'} connected)"
