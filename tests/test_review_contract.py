"""Review of issue 24: the memory store's record machine and the Redis store's Lua scripts, side by side.

The contract suite is meant to hold them to one meaning. A hypothesis state machine drives
one key of each with the same steps (claims with every coalescing mode, starts, finishes,
requeues, renewals, stop requests...) and compares every answer and the state read after
it. No step depends on time (no autoexpire, leases and debounce waits far longer than a test),
so the memory store's clock and the server's need not agree. Each difference found is a test of
its own below (each was first a strict xfail; all are fixed since).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from uniqjob.errors import BackendError
from uniqjob.locks import Holder, LockState, PendingCall, QueueMeta, RunClaim, local_holder
from uniqjob.stores.aio import async_backend
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend

HOLDER = Holder("review-host", "review-node", 4242, 1)
LEASE = 3600.0
TOKENS = st.sampled_from(["t1", "t2", "t3"])
ATTEMPTS = st.sampled_from(["", "a1", "a2"])
_keys = itertools.count()


def view(state: LockState) -> tuple[Any, ...]:
    """What a state says, without its times (the two stores' clocks differ)."""
    q, r = state.queue, state.run
    queue = None
    if q is not None:
        p = q.pending
        then = None if p is None else (p.token, p.meta.args, p.meta.job_id, p.meta.call)
        queue = (q.token, q.state, q.meta.args, q.meta.job_id, q.meta.call, q.due is not None, then)
    run = None if r is None else (r.token, r.holder.pid, r.stop)
    return queue, run, state.pending_run


def answer(value: Any) -> Any:
    """A step's answer, comparable across stores."""
    if isinstance(value, LockState):
        return ("refused", value.coalesced)
    if isinstance(value, PendingCall):
        return ("pending", value.token, value.meta.args, value.meta.job_id, value.meta.call)
    return value


class SideBySide(RuleBasedStateMachine):
    """One key on the memory store and on Redis; every step on both; answers and states equal."""

    redis: RedisBackend

    def __init__(self) -> None:
        super().__init__()
        self.memory = MemoryBackend()
        self.key = f"review:{next(_keys)}"
        self.log: list[str] = []
        self.debounce: Any = None

    @initialize(debounce=st.sampled_from([None, (1000.0, None), (1000.0, 2000.0)]))
    def debounced(self, debounce: Any) -> None:
        """One class's calls: debounced all (they all keep the last, then) or none."""
        self.debounce = debounce
        self.log.append(f"debounce={debounce}")

    def both(self, what: str, step: Any) -> None:
        self.log.append(what)
        answers = [answer(step(store)) for store in (self.memory, self.redis)]
        states = [view(store.read(self.key)) for store in (self.memory, self.redis)]
        assert answers[0] == answers[1], (self.log, answers)
        assert states[0] == states[1], (self.log, states)

    @rule(
        token=TOKENS,
        args=st.sampled_from(["", "1", "2"]),
        job_id=st.sampled_from(["", "j1", "j2"]),
        coalesce=st.sampled_from(["", "keep_last", "replace"]),
        attempt=st.sampled_from([None, ""]),  # a claim's run: an inline call's, one attempt per token
    )
    def claim(self, token: str, args: str, job_id: str, coalesce: Any, attempt: str | None) -> None:
        debounce = self.debounce
        if debounce is not None:
            coalesce = "keep_last"  # a debounced class's every call (uniqjob._coalesce.mode)
        call = f'{{"a":[{args or 0}],"k":{{}}}}' if coalesce == "keep_last" else ""
        meta = QueueMeta("review.Job", args, job_id, call)

        def step(store: Backend) -> Any:
            run = None if attempt is None else RunClaim(HOLDER, LEASE, attempt)
            return store.claim(self.key, token, meta=meta, run=run, coalesce=coalesce, debounce=debounce)

        self.both(f"claim({token}, {args!r}, {job_id!r}, {coalesce!r}, {debounce}, run={attempt!r})", step)

    @rule(
        token=TOKENS,
        attempt=ATTEMPTS,
        mode=st.sampled_from(["run", "own", "release", "keep"]),
        adopt=st.booleans(),
    )
    def start(self, token: str, attempt: str, mode: Any, adopt: bool) -> None:
        def step(store: Backend) -> Any:
            run = RunClaim(HOLDER, LEASE, attempt)
            meta = QueueMeta("review.Job")
            return store.start(self.key, token, run=run, meta=meta, adopt=adopt, queue_lock=mode)

        self.both(f"start({token}, {attempt!r}, {mode}, adopt={adopt})", step)

    @rule(token=TOKENS, keep=st.booleans(), attempt=ATTEMPTS)
    def finish(self, token: str, keep: bool, attempt: str) -> None:
        self.both(
            f"finish({token}, keep={keep}, {attempt!r})",
            lambda store: store.finish(self.key, token, keep_queue=keep, attempt=attempt),
        )

    @rule(token=TOKENS, attempt=ATTEMPTS)
    def requeue(self, token: str, attempt: str) -> None:
        meta = QueueMeta("review.Job", "r")
        self.both(
            f"requeue({token}, {attempt!r})",
            lambda store: store.requeue(self.key, token, meta=meta, ttl=None, attempt=attempt),
        )

    @rule(token=TOKENS, attempt=ATTEMPTS)
    def renew(self, token: str, attempt: str) -> None:
        self.both(f"renew({token}, {attempt!r})", lambda store: store.renew(self.key, token, LEASE, attempt))

    @rule(token=TOKENS, job_id=st.sampled_from(["j1", "j3"]))
    def attach(self, token: str, job_id: str) -> None:
        self.both(f"attach({token}, {job_id})", lambda store: store.attach(self.key, token, job_id))

    @rule(token=st.one_of(st.none(), TOKENS))
    def dequeue(self, token: str | None) -> None:
        self.both(f"dequeue({token})", lambda store: store.dequeue(self.key, token))

    # "terminate" is left out: a re-take of a run lock keeps its stop request on Redis only (below)
    @rule(token=TOKENS, mode=st.sampled_from(["buffer", "withdraw"]))
    def overlap(self, token: str, mode: Any) -> None:
        self.both(
            f"overlap({token}, {mode})",
            lambda store: store.overlap(self.key, token, mode, lease=LEASE, holder=HOLDER),
        )

    @rule(queue=st.one_of(st.none(), TOKENS), run=st.one_of(st.none(), TOKENS))
    def reclaim(self, queue: str | None, run: str | None) -> None:
        self.both(f"reclaim({queue}, {run})", lambda store: store.reclaim(self.key, queue, run))


def test_memory_and_redis_agree_on_random_sequences(redis_backend: RedisBackend) -> None:
    """The search itself: passes while the known differences (below) are kept out of its reach."""
    SideBySide.redis = redis_backend
    run_state_machine_as_test(
        SideBySide,
        settings=settings(
            max_examples=100,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )


def test_a_plain_keep_last_claim_treats_a_due_time_alike(redis_backend: RedisBackend) -> None:
    machine = SideBySide()
    machine.redis = redis_backend
    machine.debounced((1000.0, None))
    machine.claim("t1", "1", "", "", None)  # a debounced call: queued, due in 1000 s
    machine.debounced(None)
    machine.claim("t2", "2", "", "keep_last", None)  # a keep_last call of the same key, not debounced


def test_a_run_claim_retaken_with_another_attempt_is_alike(redis_backend: RedisBackend) -> None:
    machine = SideBySide()
    machine.redis = redis_backend
    machine.claim("t1", "", "", "", "")  # both locks, no attempt recorded
    machine.claim("t1", "", "", "", "a1")  # re-taken by its token, with an attempt
    machine.claim("t1", "", "", "", "")  # and again without


def test_a_stop_request_survives_a_retake_alike(redis_backend: RedisBackend) -> None:
    machine = SideBySide()
    machine.redis = redis_backend
    machine.claim("t2", "", "", "", "")  # `uniqjob run`: both locks
    for store in (machine.memory, machine.redis):
        store.overlap(machine.key, "t1", "terminate", lease=LEASE, holder=HOLDER)
    machine.claim("t2", "", "", "", "")  # its claim again (a retry after a lost reply): a re-take


def test_a_replace_claim_waits_for_replicas_like_any_grant(redis_client: Any) -> None:
    alone = RedisBackend(redis_client, namespace="review-acks")  # this server has no replica
    waiting = RedisBackend(redis_client, namespace="review-acks", replicas=1, replica_timeout=0.1)
    meta = QueueMeta("review.Job", "1", "j1")
    with pytest.raises(BackendError):  # a plain grant too few replicas acknowledged fails closed
        waiting.claim("k", "t0", meta=meta)
    assert alone.claim("k", "t1", meta=meta) is None  # a call waits in its queue
    with pytest.raises(BackendError):
        waiting.claim("k", "t2", meta=QueueMeta("review.Job", "2", "j2"), coalesce="replace")


@pytest.mark.parametrize("face", ["sync", "asyncio"])
def test_a_keep_last_call_coalesced_waits_for_replicas_like_any_grant(redis_client: Any, face: str) -> None:
    # Its arguments are what the queued (or pending) call will run with: a promoted replica without
    # them would run an older call's, its caller told it succeeded.
    namespace = f"review-acks-keep-{face}"
    alone = RedisBackend(redis_client, namespace=namespace)  # this server has no replica
    waiting = RedisBackend(redis_client, namespace=namespace, replicas=1, replica_timeout=0.1)

    def claim(key: str, token: str, version: str) -> Any:
        meta = QueueMeta("review.Job", version, f"j{version}", f'{{"a":[{version}],"k":{{}}}}')
        if face == "sync":
            return waiting.claim(key, token, meta=meta, coalesce="keep_last")
        return asyncio.run(async_backend(waiting).claim(key, token, meta=meta, coalesce="keep_last"))

    first = QueueMeta("review.Job", "1", "j1", '{"a":[1],"k":{}}')
    assert alone.claim("queued", "t1", meta=first, coalesce="keep_last") is None  # a call waits in its queue
    with pytest.raises(BackendError, match="kept"):
        claim("queued", "t2", "2")  # coalesced into it: its arguments are the queued call's now
    run = RunClaim(local_holder(), 60.0, "a1")
    assert alone.claim("running", "t3", meta=first, run=run, coalesce="keep_last") is None  # one runs
    with pytest.raises(BackendError, match="kept"):
        claim("running", "t4", "2")  # the pending call behind it
    queued = alone.read("running").queue
    assert queued is not None and queued.pending is not None  # on the master: not undone, said so
