"""Redis specifics: key layout, one round trip per transition, outages, client options."""

from __future__ import annotations

import inspect
import itertools
import socket
import time
from typing import Any

import pytest
import redis

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import BackendError, UniqueJob
from uniqjob.errors import ConfigurationError, CorruptRecordError
from uniqjob.locks import LockState, QueueMeta, RunClaim, local_holder
from uniqjob.queues import Queue
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._wire import plain


class Job(UniqueJob):
    def perform(self, n: int) -> int:
        return n


def test_all_keys_of_a_lock_share_a_hash_tag(redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis_client)
    uniqjob.configure(backend)
    lock = Job.lock(1)
    assert lock.acquire(run=True)
    names = sorted(k.decode() for k in redis_client.scan_iter("*"))
    base = f"uniqjob:{{{lock.key}}}"
    assert names == [base + ":f", base + ":q", base + ":r"]
    # Redis Cluster hashes the text between the first "{" and the next "}": one slot for all three.
    tags = {n[n.index("{") + 1 : n.index("}", n.index("{"))] for n in names}
    assert len(tags) == 1
    assert redis_client.pttl(names[2]) > 0 and redis_client.pttl(names[1]) == -1
    # The last fence is bounded in time (a day), so memory stays bounded too.
    assert 86_000_000 < redis_client.pttl(names[0]) <= 86_400_000
    lock.release()
    assert [k.decode() for k in redis_client.scan_iter("*")] == [base + ":f"]


def test_one_round_trip_per_transition(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis_client)
    monitor = redis.Redis.from_url(redis_server.url)

    def cycle(key: str) -> None:
        assert backend.claim(key, "t", meta=QueueMeta()) is None
        assert backend.start(key, "t", run=RunClaim(local_holder(), 5), meta=QueueMeta()) is None
        backend.finish(key, "t")

    cycle("warm")  # loads the scripts, so from now on each call is one EVALSHA
    before = _command_calls(monitor)
    cycle("k")
    after = _command_calls(monitor)
    delta = {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
    assert delta.pop("evalsha") == 3 and delta.pop("info") == 1
    # what is left ran inside the scripts: no command of its own crossed the wire
    inside = {"time", "hget", "hmget", "hset", "hgetall", "del", "exists", "pexpire", "pttl", "get", "set"}
    assert set(delta) <= inside


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {name: n for name, n in calls.items() if n}


def test_decode_responses_on(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    backend = RedisBackend(client, namespace="dec")
    assert backend.claim("k:é", "t", meta=QueueMeta("c", "ä")) is None
    state = backend.claim("k:é", "u", meta=QueueMeta())
    assert state is not None and state.queue is not None and state.queue.meta.args == "ä"
    assert list(backend.scan()) == ["k:é"]


def test_script_cache_flush_is_survived(redis_backend: RedisBackend, redis_client: redis.Redis) -> None:
    assert redis_backend.claim("k", "t", meta=QueueMeta()) is None
    redis_client.script_flush()
    assert redis_backend.claim("k", "u", meta=QueueMeta()) is not None


def test_namespaces_are_separate(redis_client: redis.Redis) -> None:
    a, b = RedisBackend(redis_client, namespace="a"), RedisBackend(redis_client, namespace="b")
    assert a.claim("k", "t", meta=QueueMeta()) is None
    assert b.claim("k", "t", meta=QueueMeta()) is None
    assert list(a.scan()) == ["k"] and list(b.scan()) == ["k"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_fails_closed_in_bounded_time() -> None:
    ran: list[int] = []

    class Guarded(UniqueJob):
        unique_backend = RedisBackend(f"redis://127.0.0.1:{_closed_port()}/0", timeout=1)

        def perform(self) -> None:
            ran.append(1)

    began = time.monotonic()
    with pytest.raises(BackendError, match=r"redis: .*(Connection refused|connecting)"):
        Guarded.enqueue()
    assert time.monotonic() - began < 15
    assert ran == []


def test_outage_then_recovery(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis.Redis.from_url(redis_server.url, socket_timeout=1, socket_connect_timeout=1))
    uniqjob.configure(backend)
    assert Job.run(1) == 1
    redis_server.stop()
    try:
        with pytest.raises(BackendError):
            Job.run(2)
    finally:
        redis_server.start()
    assert Job.run(3) == 3


@pytest.mark.parametrize("reply", [b"not json", b"\xff\xfe", b'["1", false]'])
def test_an_unreadable_lock_state_is_a_backend_error(redis_backend: RedisBackend, reply: bytes) -> None:
    with pytest.raises(BackendError, match="unreadable lock state"):
        redis_backend._state("k", plain(reply))  # as the wire hands every reply on


def test_the_usual_duplicate_is_left_unread_until_used(redis_backend: RedisBackend) -> None:
    meta = QueueMeta("job", "1")
    assert redis_backend.claim("quiet", "t1", meta=meta) is None
    state = redis_backend.claim("quiet", "t2", meta=meta)
    assert state is not None and state.nothing_to_reclaim
    assert state._read is not None  # rejected without building its records
    assert state.queue is not None and state.queue.token == "t1" and state.queue.meta == meta
    assert state.run is None and state._read is None
    assert state == LockState("quiet", state.queue, None, state.now)

    # A queued lock whose job a queue may prove gone has something to reclaim, once the job is old
    # enough to be asked about: the store says how old it is, and it is read only when it is.
    assert redis_backend.attach("quiet", "t1", "job-1")
    named = redis_backend.claim("quiet", "t3", meta=meta)
    assert named is not None and not named.nothing_to_reclaim and named._read is not None
    assert named.nothing_to_reclaim_yet(60.0) and named._read is not None  # too young to ask about
    assert not named.nothing_to_reclaim_yet(None) and not named.nothing_to_reclaim_yet(1e-9)
    assert named.queue is not None and named.queue.meta.job_id == "job-1" and named._read is None
    assert named.nothing_to_reclaim_yet(60.0) and not named.nothing_to_reclaim_yet(1e-9)  # read: the same

    # So is one with a run lock beside it.
    run = RunClaim(local_holder(), 30.0, "a1")
    assert redis_backend.claim("busy", "t1", meta=meta, run=run) is None
    busy = redis_backend.claim("busy", "t2", meta=meta)
    assert busy is not None and not busy.nothing_to_reclaim and busy.run is not None


def test_an_unread_state_that_is_unreadable_says_so_on_first_use(redis_backend: RedisBackend) -> None:
    state = redis_backend._state("k", "Qnot json")
    assert state.nothing_to_reclaim
    with pytest.raises(BackendError, match="unreadable lock state"):
        _ = state.queue
    young = redis_backend._state("k", "J5 Snot json")  # a job queued 5 µs ago
    assert not young.nothing_to_reclaim and young.nothing_to_reclaim_yet(1.0)
    with pytest.raises(BackendError, match="unreadable lock state"):
        _ = young.queue
    with pytest.raises(BackendError, match="unreadable lock state"):  # no age: read at once
        redis_backend._state("k", "Jx Snot json")


# Fences (issue 10): issued inside the scripts, from the server's clock, never repeated.


def _names(backend: RedisBackend, key: str = "k") -> tuple[str, str, str]:
    base = f"{backend.namespace}:{{{key}}}"
    return base + ":q", base + ":r", base + ":f"


def test_a_fence_is_the_servers_clock_in_microseconds(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    before = int(time.time() * 1_000_000)
    run = RunClaim(local_holder(), 5.0, "a")
    assert redis_backend.claim("k", "t", meta=QueueMeta(), run=run) is None
    assert abs(run.fence - before) < 5_000_000  # the server's TIME, not a counter from 1
    _, run_name, fence_name = _names(redis_backend)
    assert redis_client.hget(run_name, "f") == str(run.fence).encode()
    assert redis_client.get(fence_name) == str(run.fence).encode()


def test_a_fence_is_one_more_than_the_last_when_the_clock_is_behind_it(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    # As if the server's clock stepped back, or a grant came in the same microsecond.
    ahead = int(time.time() * 1_000_000) + 3_600_000_000
    redis_client.set(_names(redis_backend)[2], ahead)
    run = RunClaim(local_holder(), 5.0)
    assert redis_backend.start("k", "t", run=run, meta=QueueMeta()) is None
    assert run.fence == ahead + 1
    redis_backend.finish("k", "t")
    again = RunClaim(local_holder(), 5.0)
    assert redis_backend.claim("k", "u", meta=QueueMeta(), run=again) is None
    assert again.fence == ahead + 2


def test_a_queue_only_claim_issues_no_fence(redis_backend: RedisBackend, redis_client: redis.Redis) -> None:
    assert redis_backend.claim("k", "t", meta=QueueMeta()) is None
    assert not redis_client.exists(_names(redis_backend)[2])


# Records of the wrong shape (issue 10, bug 3): CorruptRecordError naming the Redis key, never a crash.

HOLDER = local_holder()


def _held(backend: RedisBackend) -> None:
    assert backend.claim("k", "t", meta=QueueMeta("Job", "(1,)"), run=RunClaim(HOLDER, 30.0, "a")) is None


@pytest.mark.parametrize(
    ("which", "field", "value"),
    [
        (0, "t", None),  # None: the field is removed
        (0, "s", "z"),
        (0, "a", "x"),
        (0, "a", "-5"),
        (0, "n", "x"),
        (0, "n", "99"),  # longer than the key
        (1, "i", "x"),  # the issue's case: a pid that is not a number
        (1, "i", "١٢"),  # digits, but not ASCII ones
        (1, "t", None),
        (1, "h", None),
        (1, "l", None),
        (1, "b", "1.5"),
        (1, "a", ""),
        (1, "f", "x"),
    ],
)
def test_a_damaged_field_is_a_corrupt_record_naming_its_redis_key(
    redis_backend: RedisBackend, redis_client: redis.Redis, which: int, field: str, value: str | None
) -> None:
    _held(redis_backend)
    name = _names(redis_backend)[which]
    if value is None:
        redis_client.hdel(name, field)
    else:
        redis_client.hset(name, field, value)
    with pytest.raises(CorruptRecordError) as caught:
        redis_backend.read("k")
    err = caught.value
    assert (err.path, err.key, err.backend) == (name, "k", "redis")
    assert f"field {field} " in err.reason
    assert "uniqjob release --force k" in str(err)
    # A conflict reports it too: another caller fails closed, nobody takes the key.
    with pytest.raises(CorruptRecordError):
        conflict = redis_backend.claim("k", "u", meta=QueueMeta(), run=RunClaim(HOLDER, 30.0))
        assert conflict is not None
        _ = conflict.queue, conflict.run
    assert "k" in list(redis_backend.scan())  # listed by name, so the operator sees it


def _primitives(backend: RedisBackend) -> dict[str, Any]:
    run = RunClaim(HOLDER, 30.0, "a")
    meta = QueueMeta()
    return {
        "read": lambda: backend.read("k"),
        "claim": lambda: backend.claim("k", "t", meta=meta),
        "claim-run": lambda: backend.claim("k", "t", meta=meta, run=run),
        "start": lambda: backend.start("k", "t", run=run, meta=meta),
        "start-release": lambda: backend.start("k", "t", run=run, meta=meta, queue_lock="release"),
        "attach": lambda: backend.attach("k", "t", "j"),
        "requeue": lambda: backend.requeue("k", "t", meta=meta, ttl=None),
        "renew": lambda: backend.renew("k", "t", 30.0),
        "finish": lambda: backend.finish("k", "t"),
        "dequeue": lambda: backend.dequeue("k", "t"),
        "reclaim": lambda: backend.reclaim("k", "t", "t"),
    }


# Which primitives read which key (the others never look at it, so cannot be hurt by it).
_READERS = {
    0: [
        "read",
        "claim",
        "claim-run",
        "start",
        "start-release",
        "attach",
        "requeue",
        "finish",
        "dequeue",
        "reclaim",
    ],
    1: ["read", "claim-run", "start", "requeue", "renew", "finish", "reclaim"],
}


@pytest.mark.parametrize(
    ("which", "call"), [(which, call) for which, calls in _READERS.items() for call in calls]
)
def test_a_key_of_the_wrong_type_is_a_corrupt_record_and_nothing_is_written(
    redis_backend: RedisBackend, redis_client: redis.Redis, which: int, call: str
) -> None:
    names = _names(redis_backend)
    redis_client.set(names[which], "garbage")  # a string where a lock (a hash) belongs
    if which == 0 and call in ("requeue", "finish", "reclaim", "renew"):
        redis_client.hset(names[1], mapping={"t": "t", "a": "1", "l": "1000"})  # ours: would be deleted
    before = {n: redis_client.dump(n) for n in names}
    with pytest.raises(CorruptRecordError) as caught:
        _primitives(redis_backend)[call]()
    err = caught.value
    assert (err.path, err.key, err.backend) == (names[which], "k", "redis")
    assert "WRONGTYPE" in err.reason and ("string" in err.reason or "hash" in err.reason)
    assert {n: redis_client.dump(n) for n in names} == before  # the script stopped before any write


@pytest.mark.parametrize("damage", ["not a number", "-5", "1.5", "hash"])
def test_an_unreadable_last_fence_is_written_over_not_a_blocked_key(
    redis_backend: RedisBackend, redis_client: redis.Redis, damage: str
) -> None:
    """No lock listing shows the last fence: damaged, it must not block its key (nothing could clear it)."""
    _q, _r, f = _names(redis_backend)
    if damage == "hash":
        redis_client.hset(f, "x", "1")
    else:
        redis_client.set(f, damage)
    run = RunClaim(HOLDER, 30.0)
    before = int(redis_client.time()[0]) * 1_000_000
    assert redis_backend.claim("k", "t", meta=QueueMeta(), run=run) is None
    assert run.fence >= before  # from the server's clock alone
    assert redis_client.get(f) == str(run.fence).encode()
    assert redis_client.pttl(f) > 0


def test_purge_removes_corrupt_records_and_keeps_the_last_fence(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    q, r, f = _names(redis_backend)
    _held(redis_backend)
    fence = int(redis_client.get(f) or 0)
    redis_client.delete(q)
    redis_client.set(q, "garbage")
    assert list(redis_backend.scan()) == ["k"]
    assert redis_backend.purge("k") == [q, r]
    assert redis_backend.read("k").free and list(redis_backend.scan()) == []
    assert int(redis_client.get(f) or 0) == fence
    run = RunClaim(HOLDER, 30.0)
    assert redis_backend.start("k", "u", run=run, meta=QueueMeta()) is None
    assert run.fence > fence
    assert redis_backend.purge("k") == [q, r] and redis_backend.purge("k") == []


def test_a_url_is_checked_by_the_config_rules() -> None:
    with pytest.raises(ConfigurationError, match="foo"):
        RedisBackend("redis://127.0.0.1:6379/0?foo=bar")
    with pytest.raises(ConfigurationError, match="notadb"):
        RedisBackend("redis://127.0.0.1:6379/notadb")


def test_a_retried_run_claim_renews_the_lease_it_finds(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    # The caller counts its lease from the reply it got: the retry's, so the store's must start again too.
    _held(redis_backend)
    _, run_name, _ = _names(redis_backend)
    redis_client.pexpire(run_name, 1000)  # as if most of the lease went by while the first reply was lost
    again = RunClaim(HOLDER, 30.0, "a")
    assert redis_backend.claim("k", "t", meta=QueueMeta("Job", "(1,)"), run=again) is None
    assert redis_client.pttl(run_name) > 29_000
    assert again.fence == int(redis_client.hget(run_name, "f") or 0) > 0


# The asyncio faces: one typed coroutine per primitive, named and shaped as the sync one.

_LOCK_PRIMITIVES = ("claim", "start", "attach", "requeue", "renew", "finish", "dequeue", "reclaim", "read")
_SLOT_PRIMITIVES = (
    "acquire", "start", "renew", "release", "requeue", "handed", "withdraw", "reap",
    "discard_parked", "drop", "read",
)  # fmt: skip


def _shape(function: Any) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    """A function's parameters (name, kind, default, annotation's text) and its return annotation."""
    signature = inspect.signature(function)
    params = [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()]
    return params, signature.return_annotation


@pytest.mark.parametrize(
    ("face", "store", "primitives"),
    [
        ("RedisAsync", "Backend", (*_LOCK_PRIMITIVES, "read_many")),
        ("RedisAsyncSemaphores", "SemaphoreStore", _SLOT_PRIMITIVES),
    ],
)
def test_each_async_primitive_is_a_coroutine_shaped_as_the_sync_one(
    face: str, store: str, primitives: tuple[str, ...]
) -> None:
    from uniqjob.stores import base, semaphores
    from uniqjob.stores.redis import _async, _async_semaphores

    async_class = getattr(_async, face, None) or getattr(_async_semaphores, face)
    sync_class = getattr(base, store, None) or getattr(semaphores, store)
    for name in primitives:
        method = vars(async_class)[name]  # its own, not a bridge it inherits
        assert inspect.iscoroutinefunction(method), name
        assert _shape(method) == _shape(getattr(sync_class, name)), name


# A queue's job is asked about only once its lock is old enough (suspect_after), on the Redis store.


class _AskingQueue(Queue):
    """Names each job before its claim, as RQ does, and says every job it is asked about is gone."""

    def __init__(self, suspect_after: float) -> None:
        self.suspect_after = suspect_after
        self.asked: list[str] = []
        self.ids = itertools.count()

    def new_job_id(self) -> str:
        return f"job-{next(self.ids)}"

    def push(self, job_cls: type[UniqueJob], lock: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return lock.meta.job_id

    def job_gone(self, job_id: str) -> bool:
        self.asked.append(job_id)
        return True


class _Suspected(UniqueJob):
    def perform(self, n: int) -> None:
        """Nothing: only its enqueues count here."""


@pytest.mark.parametrize("suspect_after", [3600.0, 1e-6])
def test_a_duplicate_reads_and_asks_about_a_queued_job_only_once_it_is_old_enough(
    redis_backend: RedisBackend, monkeypatch: pytest.MonkeyPatch, suspect_after: float
) -> None:
    """The claim's refusal says how long ago the job was queued ('J'), so a young one's snapshot is
    never read and its queue never asked; an old enough one is read, asked about, and reclaimed."""
    queue = _AskingQueue(suspect_after)
    monkeypatch.setattr(_Suspected, "unique_queue", queue)
    monkeypatch.setattr(_Suspected, "unique_backend", redis_backend)
    reads: list[str] = []
    monkeypatch.setattr(LockState, "_parts", _counting(LockState._parts, reads))
    assert _Suspected.enqueue(1) == "job-0"
    again = _Suspected.enqueue(1)
    if suspect_after > 1:
        assert again is None and queue.asked == [] and reads == []
    else:
        # a round trip later, the server's clock is past 1 µs: read, asked, reclaimed, claimed again
        assert again == "job-1" and queue.asked == ["job-0"] and reads
        assert redis_backend.read(_Suspected.lock_key(1)).queue.meta.job_id == "job-1"  # type: ignore[union-attr]


def _counting(parts: Any, reads: list[str]) -> Any:
    def counted(self: LockState) -> Any:
        if self._read is not None:
            reads.append(self.key)
        return parts(self)

    return counted


def test_a_queued_job_s_lock_with_a_damaged_since_is_read_at_once_and_named(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """The claim marks a young job's lock with its age only when its since field is a number;
    else the snapshot goes out plain, is read at once, and the damaged field names its key."""
    meta = QueueMeta("job", "1", "job-1")
    assert redis_backend.claim("k", "t1", meta=meta) is None
    young = redis_backend.claim("k", "t2", meta=meta)
    assert young is not None and young._read is not None and young.nothing_to_reclaim_yet(60.0)
    redis_client.hset(f"{redis_backend.namespace}:{{k}}:q", "a", "garbage")
    with pytest.raises(CorruptRecordError, match=r"field a \(since\) is 'garbage'") as caught:
        redis_backend.claim("k", "t3", meta=meta)
    assert caught.value.key == "k"
