"""The locks in a store: list them, reap the orphans, release one key (a corrupt record too, by force)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from .. import config
from ..concurrency import Released, release_slots
from ..errors import ConfigurationError, CorruptRecordError
from ..locks import QUEUED, RUNNING, LockState, holder_is_dead, new_token, orphaned
from ..stores.base import Backend
from ._pages import read_scan, read_slots

__all__ = ["CORRUPT", "PARKED", "LockRelease", "LockRow", "Reaped", "iter_rows", "reap", "reclaim", "release"]

#: The state of a row whose record cannot be read: it blocks its key until removed.
CORRUPT = "corrupt"
#: The state of a queued lock whose call is parked behind a concurrency limit, in no queue yet.
PARKED = "parked"
_PARKED_READ = 100_000  # parked calls read per concurrency key to find the parked locks


@dataclass(frozen=True, slots=True)
class LockRow:
    """One held key as ``uniqjob locks`` reports it; ``json`` metadata renames a field in JSON.

    Times are seconds: ``age_s`` since the lock was taken, ``ttl_s`` left
    before the queue lock autoexpires, ``lease_s`` left on the run lock's lease.
    A ``corrupt`` row has only ``path`` (where the record is), ``reason`` and,
    when the store can still tell it, ``key``.
    """

    key: str | None
    job_class: str | None = field(default=None, metadata={"json": "class"})
    args: str | None = None
    state: str = RUNNING
    #: The queue's id of the job, recorded in its queue lock (RQ, Celery); None if it has none.
    job_id: str | None = None
    host: str | None = None
    pid: int | None = None
    age_s: float | None = 0.0
    ttl_s: float | None = None
    lease_s: float | None = None
    orphaned: bool = False
    path: str | None = None
    reason: str | None = None
    #: The run waiting to run once this one ends (``uniqjob run --overlap buffer-one``), ``host:pid``.
    pending_run: str | None = None
    #: Who asked this run to stop (``uniqjob run --overlap terminate-other``), ``host:pid``.
    stop_asked_by: str | None = None
    #: The arguments of the call that runs after this one ("keep_last"), None if none waits.
    pending: str | None = None
    #: Seconds until a debounced job is due (``unique_debounce``; 0 once due), None if not debounced.
    due_s: float | None = None

    @classmethod
    def from_corrupt(cls, error: CorruptRecordError, key: str | None = None) -> LockRow:
        """Describe a record that cannot be read, as the store's error names it."""
        return cls(
            key=error.key or key or None, state=CORRUPT, age_s=None, path=error.path, reason=error.reason
        )

    @classmethod
    def from_state(cls, state: LockState, *, parked: bool = False) -> LockRow:
        """Describe one key's locks (which must not be free); ``parked``: its call waits for a slot."""
        queue, run = state.queue, state.run
        since = queue.since if queue is not None else run.started if run is not None else state.now
        return cls(
            key=state.key,
            job_class=(queue.meta.cls or None) if queue is not None else None,
            args=(queue.meta.args or None) if queue is not None else None,
            # A run lock whose queue lock autoexpired is still a running job.
            state=(PARKED if parked and queue.state == QUEUED else queue.state)
            if queue is not None
            else RUNNING,
            job_id=(queue.meta.job_id or None) if queue is not None else None,
            host=run.holder.host if run is not None else None,
            pid=run.holder.pid if run is not None else None,
            age_s=round(max(state.now - since, 0.0), 3),
            ttl_s=round(queue.ttl, 3) if queue is not None and queue.ttl is not None else None,
            lease_s=round(run.lease_left, 3) if run is not None else None,
            orphaned=orphaned(state),  # the library's one orphan rule
            pending_run=state.pending_run or None,
            stop_asked_by=(run.stop or None) if run is not None else None,
            pending=queue.pending.meta.args if queue is not None and queue.pending is not None else None,
            due_s=round(max(queue.due - state.now, 0.0), 3) if queue is not None and queue.due else None,
        )

    @property
    def waiting(self) -> bool:
        """Whether the lock is queued: in its queue, or parked for a concurrency slot (counted as queued)."""
        return self.state in (QUEUED, PARKED)

    def to_json(self) -> dict[str, object]:
        """Return the record as the JSON object ``locks --json`` prints."""
        return json_fields(self)


def json_fields(record: Any) -> dict[str, object]:
    """A dataclass's fields as a JSON object, in order; a field's ``json`` metadata is its name there."""
    return {f.metadata.get("json", f.name): getattr(record, f.name) for f in fields(record)}


@dataclass
class LockCounts:
    """Held locks counted by what they are, a row at a time (:meth:`add`)."""

    held: int = 0
    queued: int = 0  # in their queue, or parked for a concurrency slot
    running: int = 0
    orphaned: int = 0
    corrupt: int = 0
    pending: int = 0  # with a pending call ("keep_last" behind a running call)
    debouncing: int = 0  # debounced, not yet due

    def add(self, row: LockRow) -> None:
        self.held += 1
        if row.state == CORRUPT:
            self.corrupt += 1
        elif row.waiting:
            self.queued += 1
        else:
            self.running += 1
        self.orphaned += row.orphaned
        self.pending += row.pending is not None
        self.debouncing += bool(row.due_s)


def iter_rows(backend: Backend | None = None, *, job_class: str | None = None) -> Iterator[LockRow]:
    """Yield a row per held key, streaming the store's scan a page at a time; keys freed since are skipped.

    A record that cannot be read is a ``corrupt`` row, whatever ``job_class``
    (its class cannot be read either); those too damaged to name their key
    come last, from :meth:`Backend.corrupt`.
    """
    backend = backend if backend is not None else config.default_backend()
    parked: frozenset[str] | None = None  # read once, at the first queued lock that may be parked
    for state in _held(backend):
        if isinstance(state, LockRow):
            yield state
            continue
        queue = state.queue
        may_park = queue is not None and queue.state == QUEUED and not queue.meta.job_id
        if may_park and parked is None:
            parked = _parked_tokens(backend)
        row = LockRow.from_state(
            state, parked=may_park and queue is not None and queue.token in (parked or ())
        )
        if job_class is None or class_matches(row.job_class, job_class):
            yield row


def _held(backend: Backend) -> Iterator[LockState | LockRow]:
    """The state of each held key, as the scan finds it; a ``corrupt`` row for each unreadable record."""
    seen: set[str] = set()
    for key, state in read_scan(backend):
        if isinstance(state, CorruptRecordError):
            seen.add(state.path)
            yield LockRow.from_corrupt(state, key)
        elif not state.free:
            yield state
    for error in backend.corrupt():
        if error.path not in seen:
            seen.add(error.path)
            yield LockRow.from_corrupt(error)


def corrupt_at(backend: Backend, path: str) -> LockRow | None:
    """The row of the unreadable record at ``path`` that names no key (:meth:`Backend.corrupt`), if any."""
    return next((LockRow.from_corrupt(e) for e in backend.corrupt() if e.path == path), None)


def _parked_tokens(backend: Backend) -> frozenset[str]:
    """The tokens of the calls parked behind a concurrency limit: their queue locks say "queued"."""
    try:
        store = backend.semaphores()
    except ConfigurationError:  # a store that keeps no slots parks nothing
        return frozenset()
    tokens: set[str] = set()
    for state in read_slots(store, head=_PARKED_READ):
        tokens.update(p.token for p in state.head)
    return frozenset(tokens)


def class_matches(cls: str | None, wanted: str) -> bool:
    """Whether job class ``cls`` is the one ``wanted`` names (its full name, or its last dotted part)."""
    return cls is not None and (cls == wanted or cls.endswith("." + wanted))


def reclaim(backend: Backend, state: LockState) -> bool:
    """Delete the locks ``state`` shows, token-checked: a lock taken again meanwhile stays.

    A queue lock with a pending call ("keep_last") is released as its holder would have:
    the pending call is queued and pushed (:func:`_resume`).
    """
    queue, run = state.queue, state.run
    if queue is not None and queue.pending is not None and _pushable(queue.pending.meta.call):
        if run is not None:  # the dead holder's run lock first, so that the release below...
            backend.reclaim(state.key, None, run.token)
        # ...leaves alone a live redelivery of the same job (a run lock of its token taken since)
        _resume(backend, state.key, queue.token)
        return True
    # (an inline call's pending call, with no queue to push it to, goes with the dead holder's lock)
    return backend.reclaim(state.key, queue.token if queue else None, run.token if run else None)


def _pushable(call: str) -> bool:
    """Whether a pending call's job class (in its JSON) can be found and has a queue to push it to."""
    from .. import _coalesce  # here: only a key with a pending call needs them
    from .._refs import resolve_job

    ref = _coalesce.json_ref(call)
    try:
        return bool(ref) and resolve_job(ref).unique_queue is not None
    except ConfigurationError:
        return False


def _resume(backend: Backend, key: str, token: str) -> None:
    """Release a dead holder's queue lock ``token`` of ``key`` that has a pending call, and push that call.

    The release queues the pending call in the same step, as the holder's own would have
    (see :func:`uniqjob._coalesce.hand_on`).
    """
    from .. import _coalesce  # here: only a key with a pending call needs them
    from .._refs import resolve_job

    pending = backend.finish(key, token, attempt=new_token())  # an attempt of no delivery: see reclaim
    ref = _coalesce.json_ref(pending.meta.call) if pending is not None else ""
    if pending is not None and ref:
        _coalesce.hand_on(resolve_job(ref), key, pending)


@dataclass(frozen=True, slots=True)
class Reaped:
    """What :func:`reap` did.

    ``reclaimed``: the orphans reclaimed (with ``dry_run``, those it would
    reclaim); ``held``: how many keys held a readable lock; ``corrupt``: the
    records that cannot be read, skipped (each blocks its key).
    """

    reclaimed: list[LockRow]
    held: int
    corrupt: list[LockRow]


def reap(
    backend: Backend | None = None, *, dry_run: bool = False, each: Callable[[LockRow], None] | None = None
) -> Reaped:
    """Reclaim every orphaned lock in the store (by :func:`uniqjob.locks.orphaned`, and nothing else).

    Queued locks and live holders are never touched, and a lock taken again
    meanwhile is left alone (reclaim checks its token). ``each`` is called
    with every row as it is reclaimed (or would be) or skipped as corrupt,
    while the scan goes on.
    """
    backend = backend if backend is not None else config.default_backend()
    reclaimed: list[LockRow] = []
    corrupt: list[LockRow] = []
    held = 0
    for state in _held(backend):
        if isinstance(state, LockRow):
            row, into = state, corrupt
        else:
            held += 1
            row, into = LockRow.from_state(state), reclaimed
            if not row.orphaned or not (dry_run or reclaim(backend, state)):
                continue
        into.append(row)
        if each is not None:
            each(row)
    return Reaped(reclaimed, held, corrupt)


@dataclass(frozen=True, slots=True)
class LockRelease:
    """What :func:`release` did with a lock key (or the path of a corrupt record).

    ``row`` shows the locks as found (a ``corrupt`` row for an unreadable
    record). ``done``: ``released``; ``alive``, refused: a live holder has the
    run lock (its lease is fresh) and no ``force``; ``changed``, nothing
    released: the lock changed hands meanwhile; ``corrupt``, refused: the
    record cannot be read and no ``force``; ``purged``: the unreadable record
    was removed (``removed`` names what went, in the store's own names);
    ``gone``: it was gone already; ``unsupported``: this store cannot remove
    records by force.
    """

    row: LockRow
    done: Literal["released", "alive", "changed", "corrupt", "purged", "gone", "unsupported"]
    removed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True if something was released or removed."""
        return self.done in ("released", "purged")


def release(
    key: str, backend: Backend | None = None, *, force: bool = False
) -> LockRelease | Released | None:
    """Release what ``key`` names, as ``uniqjob release KEY`` does; None if it names nothing held.

    A lock key: its locks, unless a live holder has the run lock (``force``
    releases it anyway: its job would then run on unlocked). A concurrency
    key: its stale slots, promoting into them (see :func:`uniqjob.ops.release_slots`).
    A record that cannot be read, named by its key or (if it names none) by
    its path: removed only with ``force``.
    """
    backend = backend if backend is not None else config.default_backend()
    try:
        state = backend.read(key)
    except CorruptRecordError as exc:
        return _release_corrupt(backend, key, LockRow.from_corrupt(exc, key), force=force)
    if state.free:
        slots = release_slots(key, backend, force=force)
        if slots is not None:
            return slots
        corrupt = corrupt_at(backend, key)  # the path of a record too damaged to name its key
        return None if corrupt is None else _release_corrupt(backend, key, corrupt, force=force)
    row = LockRow.from_state(state)
    if state.run is not None and not force and not holder_is_dead(state.run.holder):
        return LockRelease(row, "alive")
    return LockRelease(row, "released" if reclaim(backend, state) else "changed")


def _release_corrupt(backend: Backend, target: str, row: LockRow, *, force: bool) -> LockRelease:
    """Remove the unreadable record ``target`` names (its key or its path), if ``force``."""
    if not force:
        return LockRelease(row, "corrupt")
    try:
        removed = backend.purge(target)
    except NotImplementedError:
        return LockRelease(row, "unsupported")
    return LockRelease(row, "purged", tuple(removed)) if removed else LockRelease(row, "gone")
