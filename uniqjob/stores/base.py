"""The store contract: a handful of atomic primitives over one key's locks, and its semaphores.

The lock contract is :class:`Backend`; the semaphore contract is
:class:`~uniqjob.stores.semaphores.SemaphoreStore`, which a backend offers
through :meth:`Backend.semaphores`.

Policy (conflict handling, the same-host liveness check, heartbeats) lives once,
above the backends. A backend only makes each primitive atomic, reads time from
its own clock (on Redis the server's ``TIME``, never the client's) and acts on
a lock only while the caller's token still matches.

Every backend passes the shared contract suite in ``tests/test_backend_contract.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Literal

from ..errors import ConfigurationError, CorruptRecordError
from ..locks import Holder, LockState, PendingCall, QueueMeta, RunClaim
from ._drops import KINDS, Tally, check_window
from .semaphores import SemaphoreStore, read_each

__all__ = ["Backend", "Coalesce", "Debounce", "Overlap", "OverlapMode", "QueueMode", "SemaphoreStore"]

#: What taking the run lock does to the queue lock: see :meth:`Backend.start`.
QueueMode = Literal["run", "release", "keep", "own"]
#: What a claim does with a conflicting queue lock of another token: see :meth:`Backend.claim`.
Coalesce = Literal["", "keep_last", "replace"]
#: A debounced claim's delay and longest wait (None: no bound), seconds: see :meth:`Backend.claim`.
Debounce = tuple[float, float | None]
#: What a run that finds its key busy asks for: see :meth:`Backend.overlap`.
OverlapMode = Literal["buffer", "terminate", "withdraw", "follow"]
#: What :meth:`Backend.overlap` decided.
Overlap = Literal["free", "pending", "coalesced", "stopping", "busy"]


class Backend(ABC):
    """Where locks live. Subclasses implement the primitives below."""

    #: Short name used in errors and logs.
    name = "backend"

    @abstractmethod
    def claim(
        self,
        key: str,
        token: str,
        *,
        meta: QueueMeta,
        ttl: float | None = None,
        run: RunClaim | None = None,
        count: bool = False,
        counted: float | None = None,
        coalesce: Coalesce = "",
        debounce: Debounce | None = None,
    ) -> LockState | None:
        """Take the queue lock of ``key`` for ``token``; None when taken, else the state in the way.

        First, an orphan is reclaimed: a queue lock in state ``running`` whose
        run lock has lapsed. A queue lock otherwise conflicts. ``ttl`` (seconds)
        bounds the new lock's life (autoexpire). With ``run``, the lock is taken
        in state ``running`` together with the run lock, in the same step; then
        a live run lock (whose queue lock autoexpired) conflicts too.

        Granting ``run`` sets ``run.fence`` as :meth:`start` does. A claim is
        idempotent for its token: retried after a lost reply, it finds its
        own lock and succeeds again (with the same fence).

        ``count`` and ``counted``: see :meth:`drops`.

        **Coalescing** (``coalesce``). A live queue lock of
        another token is then changed in the same step, and the state returned
        says how (:attr:`LockState.coalesced`), as it was before the change:

        - ``"keep_last"``, the lock ``queued``: its call becomes this one
          (``meta.args`` and ``meta.call``; a pending call is dropped), so its
          job runs with the latest arguments (:meth:`start` hands them over):
          ``"latest"``.
        - ``"keep_last"``, the lock ``running``: this call (``token`` and
          ``meta``) becomes the lock's pending call, replacing any earlier one;
          :meth:`finish` turns it into the queued lock: ``"pending"``.
        - ``"replace"``, the lock ``queued``: the lock becomes ``token``'s, with
          ``meta`` (its job id too): ``"replaced"``; the state shows the lock it
          replaced, whose job the caller removes from its queue. The lock is the
          caller's: the replaced job's :meth:`start` with ``queue_lock="own"``
          is refused from now on.

        Anything else (``replace`` of a running lock) refuses as without ``coalesce``.

        **Debounce** (``debounce``: seconds, and the longest wait or None). A
        queue lock taken, or made ``"latest"``, gets a due time (the store's clock):
        ``seconds`` from now, but never later than the longest wait after the lock
        was taken (``since``). A :meth:`start` with ``queue_lock="own"`` before it
        is due is refused, the state showing the due time (``QueueRecord.due``).
        """

    @abstractmethod
    def start(
        self,
        key: str,
        token: str,
        *,
        run: RunClaim,
        meta: QueueMeta,
        ttl: float | None = None,
        adopt: bool = False,
        queue_lock: QueueMode = "run",
        count: bool = False,
        counted: float | None = None,
    ) -> LockState | None:
        """Take the run lock of ``key`` for ``token``; None when taken, else the state in the way.

        A live run lock of another token conflicts, and so does one of the same
        token taken by another attempt (``run.attempt``: a second delivery of
        one job); the caller can re-take it once it proves that holder dead.
        What happens to the queue lock, in the same step, depends on ``queue_lock``:

        - ``"run"``: it moves to state ``running`` if it is ``token``'s, and is
          created (with ``ttl``) if missing;
        - ``"release"``: it is deleted if it is ``token``'s (the lock passes
          from queue to run atomically);
        - ``"keep"``: it is not touched;
        - ``"own"``: as ``"run"``, but the start is refused (the state returned)
          unless the queue lock is ``token``'s (or any, with ``adopt``): a job
          whose call was replaced or taken over never runs; and while the queue
          lock is not yet due (see :meth:`claim`'s debounce). With a ``ttl``, a
          queue lock that is gone autoexpired while its job waited: taken. The
          queue lock then has no expiry while its run lasts (a pending call waits in it).

        When granted, ``run.call`` is set to the arguments the queue lock recorded
        (``meta.call``, the latest call's when claims coalesced into it), or "".

        With ``adopt``, a queue lock of any token counts as ``token``'s (a
        queue that cannot carry tokens); without it, another token's queue lock
        is a successor's and is left alone.

        **Fence.** When the run lock is granted, the store sets ``run.fence``,
        in the same atomic step, to an integer strictly greater than every
        fence it issued for ``key`` before, across releases: the larger of
        its clock in microseconds and the last fence of the key plus one (the
        last fence is kept for a day after each grant, so only a store clock
        stepping back by more than a day could repeat one). A re-take of the
        run lock by the same token and attempt (a retry after a lost reply)
        gets the fence it already holds.

        ``count`` and ``counted``: see :meth:`drops`.
        """

    @abstractmethod
    def attach(self, key: str, token: str, job_id: str) -> bool:
        """Record ``job_id`` in ``token``'s queue lock, now that its queue holds the job; False if not ours.

        Only a lock that names its job can be reclaimed when the queue proves
        that job gone, so the id is recorded after the push, never before it.
        """

    @abstractmethod
    def requeue(self, key: str, token: str, *, meta: QueueMeta, ttl: float | None, attempt: str = "") -> bool:
        """Turn ``token``'s run into a wait for a retry, in one step; False if the key is another's.

        ``token``'s run lock goes. Its queue lock becomes ``queued`` again (ttl
        counted afresh), or is created if missing; a queue lock of another token
        is kept, unless it is an orphan (``running`` with no run lock).

        With ``attempt``, a run lock of ``token`` taken by another attempt is
        another live delivery's (see :meth:`start`): nothing changes and the
        answer is False. See :meth:`finish` for which run locks an attempt owns.
        """

    @abstractmethod
    def renew(self, key: str, token: str, lease: float, attempt: str = "") -> bool:
        """Extend ``token``'s run lock to ``lease`` seconds from now; False if it is no longer ours.

        With ``attempt``, a run lock of ``token`` taken by another attempt is
        not ours either (see :meth:`finish`): it is left as it is. A run lock
        whose holder was asked to stop (:meth:`overlap`, ``"terminate"``) is
        not extended either, and the answer is False: its holder stops, as for
        a lost lock, and the lease lapses at the latest where it was.
        """

    def overlap(self, key: str, token: str, mode: OverlapMode, *, lease: float, holder: Holder) -> Overlap:
        """Decide, in one atomic step, what a run of ``token`` that found ``key`` busy does next.

        The key is busy while a lock of another token is in the way of a claim
        (a queued lock, a running one with a live run lock). ``"buffer"``: if
        another token's run is pending (recorded by this call, not lapsed, and
        not yet holding the run lock itself), ``"coalesced"`` (a run lock of another
        token that holds the key is marked as owing one more run: see ``"follow"``); else, if the key
        is busy, ``token`` becomes (or stays) the one pending run, for ``lease``
        seconds unless it calls again, ``"pending"``; else ``"free"`` (claim
        it: a pending run of ``token`` is kept until its run lock holds the key).
        ``"terminate"``: a run lock of another token is asked to stop (its
        :meth:`renew` says False from now on), ``"stopping"``; a busy key with no
        run lock to ask, ``"busy"``; else ``"free"``. ``"withdraw"``: the pending run
        of ``token`` goes, if it is there (it took the key, or gave up), ``"free"``. ``"follow"``, by a
        run that ends, while its run lock holds the key: ``"coalesced"`` if a pending run waits
        (marked as watched by ``token``: its withdraw once it took the key leaves that said);
        else ``"pending"`` if runs coalesced while it held the key (the run owed to them is the
        caller's to give), or ``"free"``. Again after its release: ``"coalesced"`` while the
        pending run it watches waits, ``"free"`` once that run took the key, ``"pending"`` if it
        is gone (withdrawn without the key, lapsed). A re-take of a run lock by its
        token keeps its marks (a stop request, a run owed). ``holder`` is the caller,
        as ``uniqjob locks`` shows it (``LockState.pending_run``, ``RunRecord.stop``).
        The record lives with the key's locks (on Redis, a key of the same hash tag).
        """
        raise ConfigurationError(f"{type(self).__name__} cannot record pending runs or stop requests")

    @abstractmethod
    def finish(
        self, key: str, token: str, *, keep_queue: bool = False, attempt: str = ""
    ) -> PendingCall | None:
        """Release ``key``'s run lock and (unless ``keep_queue``) its queue lock, each only if ``token``'s.

        **A pending call** (see :meth:`claim`'s coalescing): when ``token``'s queue
        lock goes and holds one, it becomes the key's queue lock instead, ``queued``,
        in the same step, and is returned for the caller to push; else None. The same
        call (token, attempt) made again, its reply lost, returns it again while it
        waits; no other release of ``token`` does (the call is handed on once).

        **Attempts.** Two deliveries of one job share its token and differ by
        attempt (``RunClaim.attempt``). Given ``attempt``, the run lock is
        ``token``'s own only if it records the same attempt or none (a lock
        taken without one). A run lock of ``token`` and another attempt is a
        second delivery that is still running: it is left, and so is the queue
        lock, which that delivery holds (``running``) too. With no run lock
        held (its lease lapsed), the queue lock goes if it is ``token``'s, as
        without an attempt. Without ``attempt`` (""), the token alone decides,
        for callers that have none: this, :meth:`renew` and :meth:`requeue`
        then act on any run lock of ``token``.
        """

    @abstractmethod
    def dequeue(self, key: str, token: str | None = None) -> bool:
        """Release the queue lock of ``key`` while it is still ``queued``; True if released.

        With ``token``, only that token's lock; a running lock is left to its holder.
        """

    @abstractmethod
    def reclaim(self, key: str, queue_token: str | None, run_token: str | None) -> bool:
        """Delete the locks of ``key`` that still carry the given tokens; True if any went.

        The caller has proved the holder dead; the tokens make sure that a lock
        taken since by someone else is never touched.
        """

    @abstractmethod
    def read(self, key: str) -> LockState:
        """Return a snapshot of ``key``'s locks (lapsed leases already dropped)."""

    def read_many(self, keys: Sequence[str]) -> list[LockState | CorruptRecordError]:
        """Return :meth:`read` of each of ``keys``, in order; a damaged record's error in its place.

        The listings read the store a page of keys at a time through this.
        This default calls :meth:`read` for each key; a store that can read
        many keys in one round trip (Redis pipelines them) overrides it.
        """
        return read_each(self.read, keys)

    @abstractmethod
    def scan(self) -> Iterator[str]:
        """Yield every key that has a lock, streaming (never loading all at once)."""

    def duplicates(self, window: float = 3600.0) -> dict[str, int]:
        """Return the dropped duplicates per job class over ``window`` seconds (see :meth:`drops`)."""
        return self.drops(window)["duplicates"]

    def drops(self, window: float = 3600.0) -> Tally:
        """Return the refused calls per kind and job class over the last ``window`` seconds (at most 3600).

        ``{"duplicates": {class: n}, "coalesced": {...}, "replaced": {...}}``:
        *duplicates* the policy dropped, rescheduled or raised; *coalesced*, calls
        whose arguments a queued or pending call took over ("keep_last", debounce);
        *replaced*, calls that took a queued call's place ("replace").

        **Counting.** A :meth:`claim` or :meth:`start` given ``count`` that is
        refused (or coalesced) counts one call of ``meta.cls``, of its kind, in
        the same atomic step, in a bucket per minute of the store's clock kept
        an hour and a bucket; the window is counted in whole buckets (those it
        overlaps). Not counted: a call with no class (nothing to attribute it
        to), and a refusal by a run lock of the caller's own token (a second
        delivery of one job, not a duplicate call). A caller that resolves a
        counted refusal (it proves the holder dead, reclaims, tries again) passes
        that refusal's ``LockState.now`` as ``counted``: if granted, the call
        takes back a count of that minute (a dropped duplicate's, else a
        coalesced or replaced call's), in the step that grants it; if refused,
        it counts nothing more. Every process's counts are kept
        in the store, so this reads the whole store's.

        A store that keeps no counts returns every kind empty.
        """
        check_window(window)
        return {name: {} for name in KINDS.values()}

    def purge(self, key: str) -> list[str]:
        """Remove every record of ``key``, whatever it holds (a corrupt one too); return what went.

        The names returned are the store's own (files, Redis keys), for the
        operator who asked (``uniqjob release --force``). Nothing is checked:
        this is the one primitive that acts without a token.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot remove records by force")

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield an error for each record so damaged that :meth:`scan` cannot name its key.

        Each error's ``path`` is what :meth:`purge` accepts in place of a key.
        A record whose key can still be read is yielded by :meth:`scan`, and
        :meth:`read` raises :class:`CorruptRecordError` for it.
        """
        return iter(())

    def namespaces(self, limit: int = 100_000) -> list[str]:
        """The namespaces holding locks beside this store's own (Redis: on its server), sorted.

        A bounded look (about ``limit`` records), for ``uniqjob locks`` to point
        at locks it was not asked for. A store without namespaces returns ``[]``.
        """
        return []

    def semaphores(self) -> SemaphoreStore:
        """Return a new semaphore store kept beside these locks: the same place, a key space of its own.

        The concurrency limits of jobs on this backend use it (one per backend
        object, made on first use). Redis: the same server and namespace, under
        ``<namespace>:c:``; files: the ``concurrency/`` directory inside the
        lock directory; memory: this process. A backend that keeps no slots
        leaves this as it is: a job with a concurrency limit then fails with
        :class:`ConfigurationError`.
        """
        raise ConfigurationError(
            f"{type(self).__name__} keeps no concurrency slots: use Redis, file or memory, "
            "or give the backend a semaphores() method returning a uniqjob.concurrency.SemaphoreStore"
        )

    def close(self) -> None:  # noqa: B027 - optional: most backends hold nothing
        """Release connections and files held by the backend."""
