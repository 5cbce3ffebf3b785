"""The concurrency layer under store faults (issue 10, items 3, 8 and 9).

A step that fails undoes what the call took before it (a denied or failed-over
concurrency store never strands the call's uniqueness lock, and a failed
uniqueness step frees the slot); any exception from the client reaches the
caller as a BackendError carrying its cause, and never after perform ran;
a malformed record in Redis is a CorruptRecordError naming its Redis key.

The faults are real: a Redis ACL user denied one of the two key spaces, records
written with the wrong shape, a client whose commands raise something else.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import redis

import uniqjob
from tests.concurrency_jobs import RecordingQueue
from tests.redis_server import RedisServer
from uniqjob import UniqueJob
from uniqjob._undo import undos
from uniqjob.concurrency import Park, Parked, _job_sync, discard_parked, store_for, sweep
from uniqjob.concurrency._settings import ConcurrencyPolicy
from uniqjob.concurrency.codec import decode_call, encode_call
from uniqjob.errors import BackendError, ConcurrencyLimitExceeded, CorruptRecordError, UnstorableCallError
from uniqjob.heartbeat import heartbeat
from uniqjob.integrations import settle
from uniqjob.locks import local_holder
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._semaphores import RedisSemaphores
from uniqjob.stores.semaphores import SemaphoreStore

RAN: list[Any] = []
QUEUE = RecordingQueue()


class Slotted(UniqueJob):
    """Inline, one at a time, refused when full: a leftover slot would make the next run raise."""

    concurrency_limit = 1
    concurrency_on_conflict: ClassVar[ConcurrencyPolicy] = "raise"

    def perform(self, n: int) -> int:
        RAN.append(n)
        return n


class Blocking(Slotted):
    """Inline "block": the call would park and wait in this process."""

    concurrency_on_conflict = "block"


class Discarded(Slotted):
    concurrency_on_conflict = "discard"


class WhileRunning(Slotted):
    """Takes its slot before any uniqueness lock: the other ordering."""

    unique_strategy = "while_executing"


class Parking(UniqueJob):
    """One at a time through a queue: the second call parks, holding its uniqueness lock."""

    unique_queue = QUEUE
    concurrency_limit = 1

    def perform(self, n: int) -> int:
        RAN.append(n)
        return n


class Queued(UniqueJob):
    """Enqueued to a queue; a worker performs it (``RecordingQueue.work``)."""

    unique_queue = QUEUE
    concurrency_limit = 2  # the failed delivery's slot may stay reserved until its lease lapses
    concurrency_on_conflict = "raise"

    def perform(self, n: int) -> int:
        RAN.append(n)
        return n


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    QUEUE.pushed.clear()
    yield
    QUEUE.pushed.clear()


_names = itertools.count()


@pytest.fixture
def ns() -> str:
    return f"fc{next(_names)}"


@pytest.fixture
def full(redis_client: redis.Redis, ns: str) -> RedisBackend:
    """A backend with every right, on the namespace the limited user works in."""
    return RedisBackend(redis_client, namespace=ns)


@pytest.fixture
def limited(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Callable[[str], redis.Redis]]:
    """Make a client of a real ACL user allowed only the keys matching a pattern; the users go after."""
    users: list[str] = []
    clients: list[redis.Redis] = []

    def make(pattern: str) -> redis.Redis:
        user = f"uniqjob-limited-{next(_names)}"
        redis_client.acl_setuser(
            user, enabled=True, passwords=["+pw"], commands=["+@all"], reset_keys=True, keys=[pattern]
        )
        users.append(user)
        client = redis.Redis(host="127.0.0.1", port=redis_server.port, username=user, password="pw")
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    for user in users:
        redis_client.acl_deluser(user)


def keys(client: redis.Redis, pattern: str) -> list[str]:
    return sorted(k.decode() if isinstance(k, bytes) else str(k) for k in client.keys(pattern))


def held(client: redis.Redis, ns: str) -> list[str]:
    """Every lock and slot record under ``ns``: queue locks, run locks, concurrency structures.

    A key's fence counter is not one: it outlives every lock by design.
    """
    return keys(client, f"{ns}:{{*}}:[qr]") + keys(client, f"{ns}:c:*")


# -- item 9: a failed step undoes what the call took before it ----------------------------


@pytest.mark.parametrize("job", [Slotted, Blocking, Discarded], ids=lambda j: j.__name__)
def test_a_denied_slot_step_of_an_inline_run_leaves_no_uniqueness_lock(
    job: type[Slotted], limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    client = limited(f"{ns}:{{*")  # the lock keys only: every <ns>:c:... key is denied
    uniqjob.configure(RedisBackend(client, namespace=ns))
    with pytest.raises(BackendError, match=r"(?i)noperm|permission"):
        job.run(1)
    assert RAN == []
    assert held(full.client, ns) == []  # nothing queued, nothing running, no expiry needed
    uniqjob.configure(full)
    assert job.run(1) == 1  # the key is not refused as a duplicate of nothing


def test_a_denied_slot_step_of_a_worker_releases_the_jobs_lock(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    uniqjob.configure(full)
    Queued.enqueue(1)  # queue lock and a reserved slot, taken with every right
    uniqjob.configure(RedisBackend(limited(f"{ns}:{{*"), namespace=ns))
    with pytest.raises(BackendError):
        QUEUE.work()  # the worker's slot step is denied
    assert RAN == []
    assert keys(full.client, f"{ns}:{{*}}:[qr]") == []  # the uniqueness lock went with the failed delivery
    uniqjob.configure(full)
    assert Queued.enqueue(1) is not None  # not dropped as a duplicate of a job that will never run


def test_a_denied_slot_step_at_enqueue_leaves_nothing_behind(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    uniqjob.configure(RedisBackend(limited(f"{ns}:{{*"), namespace=ns))
    with pytest.raises(BackendError):
        Queued.enqueue(1)
    assert QUEUE.pushed == []
    assert held(full.client, ns) == []
    uniqjob.configure(full)
    assert Queued.enqueue(1) is not None


def test_a_failed_uniqueness_step_frees_the_slot_taken_before_it(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    client = limited(f"{ns}:c:*")  # the concurrency keys only: the run lock is denied
    uniqjob.configure(RedisBackend(client, namespace=ns))
    with pytest.raises(BackendError):
        WhileRunning.run(1)
    assert RAN == []
    assert held(full.client, ns) == []  # the slot was freed, not left to lapse
    uniqjob.configure(full)
    assert WhileRunning.run(1) == 1  # a leftover slot would raise ConcurrencyLimitExceeded


def test_a_failed_uniqueness_step_of_a_worker_frees_the_slot_it_started(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    uniqjob.configure(full)
    Queued.enqueue(1)
    uniqjob.configure(RedisBackend(limited(f"{ns}:c:*"), namespace=ns))  # slots yes, run locks no
    with pytest.raises(BackendError):
        QUEUE.work()
    assert RAN == []
    assert keys(full.client, f"{ns}:c:*") == []  # started, then freed when the run lock was denied


@pytest.fixture(scope="module")
def replica() -> Iterator[redis.Redis]:
    """A read-only replica, as a client still pointed at the old primary finds it after a failover."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.replicaof("127.0.0.1", "1")  # a primary that never answers: stays read-only
        yield client
        client.close()


def test_a_slot_step_after_a_failover_strands_no_uniqueness_lock(
    replica: redis.Redis, full: RedisBackend, ns: str
) -> None:
    uniqjob.configure(SlotsApart(full.client, replica, ns))
    with pytest.raises(BackendError, match="read only replica"):
        Blocking.run(1)
    assert RAN == []
    assert held(full.client, ns) == []
    uniqjob.configure(full)
    assert Blocking.run(1) == 1


def test_a_failed_slot_step_of_a_delivery_is_settled_by_its_queue(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str
) -> None:
    """With ``settle`` (a queue that may retry) the queue decides: here it keeps the lock for its retry."""
    uniqjob.configure(full)
    Queued.enqueue(1)
    _, key, token, args, kwargs = QUEUE.pushed.pop()
    uniqjob.configure(RedisBackend(limited(f"{ns}:{{*"), namespace=ns))
    lock = Queued.lock_from(key, token)
    seen: list[BaseException | None] = []

    def retry_later(exc: BaseException | None, result: Any) -> None:
        seen.append(exc)
        settle(lock, 5.0)

    with pytest.raises(BackendError):
        _job_sync.execute(Queued, lock, args, kwargs, lambda: pytest.fail("performed"), settle=retry_later)
    assert len(seen) == 1 and isinstance(seen[0], BackendError)
    kept = full.read(key).queue
    assert kept is not None and kept.token == token  # still held, queued, for the retry
    uniqjob.configure(full)
    assert Queued.execute(Queued.lock_from(key, token), args, kwargs) == 1  # and the retry runs
    assert held(full.client, ns) == []


def test_a_heartbeat_that_cannot_start_gives_back_the_slot_and_the_lock(
    full: RedisBackend, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uniqjob.configure(full)

    def no_thread(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(heartbeat, "start", no_thread)
    with pytest.raises(RuntimeError, match="new thread"):
        Slotted.run(1)
    assert RAN == []
    assert held(full.client, ns) == []


def test_a_slot_step_raising_a_non_redis_error_is_undone_and_a_backend_error(
    full: RedisBackend, ns: str
) -> None:
    """A store whose slot step raises something else (a cluster client, a bug): still undone."""
    error = AttributeError("'NoneType' object has no attribute 'poll'")
    uniqjob.configure(SlotsApart(full.client, Raising(full.client, error), ns))
    with pytest.raises(BackendError) as caught:
        Slotted.run(1)
    assert isinstance(caught.value.__cause__, AttributeError)
    assert held(full.client, ns) == []


# -- item 8: every client exception is a BackendError, never after perform ----------------


class Raising(redis.Redis):
    """A real client whose script calls raise ``error`` while ``armed``, as a cluster client or bug would."""

    def __init__(self, base: redis.Redis, error: Exception, *, armed: bool = True) -> None:
        super().__init__(connection_pool=base.connection_pool)
        self.error = error
        self.armed = armed

    def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            raise self.error
        return super().evalsha(*args, **kwargs)


class SlotsApart(RedisBackend):
    """A Redis backend whose concurrency slots go through another client (``semaphores()``)."""

    def __init__(self, client: redis.Redis, slots: redis.Redis, namespace: str) -> None:
        super().__init__(client, namespace=namespace)
        self.slots_client = slots

    def semaphores(self) -> SemaphoreStore:
        return RedisSemaphores(self.slots_client, namespace=self.namespace)


@pytest.mark.parametrize("error", [AttributeError("no attribute 'poll'"), TypeError("bad"), OSError("gone")])
def test_any_client_exception_reaches_the_caller_as_a_backend_error(
    full: RedisBackend, ns: str, error: Exception
) -> None:
    store = RedisSemaphores(Raising(full.client, error), namespace=ns)
    with pytest.raises(BackendError) as caught:
        store.read("k")
    assert caught.value.__cause__ is error
    assert caught.value.backend == "redis"


class Breaking(Slotted):
    """Arms the slot store's client inside perform: the slot's release after it fails."""

    client: Raising | None = None

    def perform(self, n: int) -> int:
        assert Breaking.client is not None
        Breaking.client.armed = True
        return super().perform(n)


def test_a_slot_release_that_raises_after_perform_is_logged_and_the_result_returned(
    full: RedisBackend, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    Breaking.client = Raising(
        full.client, AttributeError("'NoneType' object has no attribute 'poll'"), armed=False
    )
    uniqjob.configure(SlotsApart(full.client, Breaking.client, ns))
    with caplog.at_level(logging.ERROR, logger="uniqjob.concurrency.semaphore"):
        assert Breaking.run(7) == 7
    assert RAN == [7]
    assert "could not release concurrency slot" in caplog.text


def test_repr_of_the_store_never_raises_for_a_client_without_a_pool(full: RedisBackend) -> None:
    class Poolless:
        """A client that is not redis-py's (as a cluster client is): no ``connection_pool``."""

        def register_script(self, script: str) -> object:
            return full.client.register_script(script)

        def __repr__(self) -> str:
            return "Poolless()"

    store = RedisSemaphores(Poolless(), namespace="x")  # type: ignore[arg-type]
    assert "Poolless()" in repr(store)


def test_repr_names_the_server(full: RedisBackend, redis_server: RedisServer) -> None:
    assert f"127.0.0.1:{redis_server.port}" in repr(store_for(full))


# -- item 3: malformed records are CorruptRecordErrors naming the Redis key ---------------

K = "order-1"
SLOT = {
    "st": "running",
    "via": "inline",
    "h": "",
    "dl": 9e15,
    "ls": 1000,
    "since": 1,
    "redo": 0,
    "args": "",
    "p": "",
}
ENTRY = {"via": "queue", "h": "", "ls": 1000, "since": 1, "args": "", "p": "{}"}


def _slot(**changes: Any) -> str:
    return json.dumps({**SLOT, **changes})


def _hset(part: str, field: str, value: str) -> Callable[[redis.Redis, str], str]:
    def plant(client: redis.Redis, ns: str) -> str:
        client.hset(f"{ns}:c:{{{K}}}:meta", mapping={"limit": 1, "cls": "x"})
        name = f"{ns}:c:{{{K}}}:{part}"
        client.hset(name, field, value)
        if part == "entries":
            client.rpush(f"{ns}:c:{{{K}}}:parked", field)
        return name

    return plant


def _wrong_type(part: str) -> Callable[[redis.Redis, str], str]:
    def plant(client: redis.Redis, ns: str) -> str:
        name = f"{ns}:c:{{{K}}}:{part}"
        client.set(name, "a string")
        return name

    return plant


CORRUPTIONS = {
    "slot not JSON": _hset("slots", "t1", "{not json"),
    "slot a number": _hset("slots", "t1", "5"),
    "slot dl a string": _hset("slots", "t1", _slot(dl="x")),
    "slot without dl": _hset("slots", "t1", json.dumps({k: v for k, v in SLOT.items() if k != "dl"})),
    "slot status unknown": _hset("slots", "t1", _slot(st="sleeping")),
    "slot holder garbage": _hset("slots", "t1", _slot(h="[1, 2")),
    "slot redo a float": _hset("slots", "t1", _slot(redo=1.5)),
    "entry not JSON": _hset("entries", "t2", "]"),
    "entry via unknown": _hset("entries", "t2", json.dumps({**ENTRY, "via": "post"})),
    "entry since null": _hset("entries", "t2", json.dumps({**ENTRY, "since": None})),
    "limit not a number": _hset("meta", "limit", "x"),
    "slots a string": _wrong_type("slots"),
    "parked a string": _wrong_type("parked"),
    "entries a string": _wrong_type("entries"),
    "waiters a string": _wrong_type("waiters"),
    "meta a string": _wrong_type("meta"),
    "done a string": _wrong_type("done"),
}

STEPS: dict[str, Callable[[SemaphoreStore], object]] = {
    "read": lambda s: s.read(K, head=5),
    "acquire": lambda s: s.acquire(
        K, "new", limit=1, lease=30, running=True, holder=local_holder(),
        park=Park("inline", holder=local_holder(), lease=30), job_class="x", args="", caller=local_holder(),
    ),
    "release": lambda s: s.release(K, "t1", caller=local_holder()),
    "renew": lambda s: s.renew(K, "t1", 30, caller=local_holder()),
}  # fmt: skip


# The steps that never read the damaged part, or rewrite it whole, and rightly succeed.
PASSING = {
    ("slot holder garbage", "release"),  # releasing slot t1 removes it, holder and all
    ("slot holder garbage", "renew"),  # renewing t1 needs its deadline, not its holder
    ("limit not a number", "acquire"),  # acquire records the caller's limit first
    ("entries a string", "release"),  # nothing parked: the emptied key is tidied away, the string too
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_malformed_record_is_a_corrupt_record_error_naming_its_redis_key(
    full: RedisBackend, ns: str, corruption: str, step: str
) -> None:
    where = CORRUPTIONS[corruption](full.client, ns)
    store = store_for(full)
    try:
        STEPS[step](store)
    except CorruptRecordError as exc:
        assert (exc.path, exc.key, exc.backend) == (where, K, "redis")
        assert exc.reason
        assert "uniqjob release --force" in str(exc)
        return
    assert (corruption, step) in PASSING, "a step met a malformed record and did not say so"


def test_a_corrupt_slot_fails_an_inline_run_closed_and_strands_nothing(full: RedisBackend, ns: str) -> None:
    uniqjob.configure(full)
    name = f"{ns}:c:{{{Slotted.job_name()}}}:slots"
    full.client.hset(name, "t1", "{not json")
    full.client.hset(f"{ns}:c:{{{Slotted.job_name()}}}:meta", mapping={"limit": 1, "cls": "x"})
    with pytest.raises(CorruptRecordError) as caught:
        Slotted.run(1)
    assert caught.value.path == name
    assert RAN == []
    assert keys(full.client, f"{ns}:{{*}}:[qr]") == []  # the uniqueness lock was dropped
    full.client.delete(name)
    assert Slotted.run(1) == 1


def test_a_full_key_still_raises_the_limit_not_a_backend_error(full: RedisBackend) -> None:
    uniqjob.configure(full)
    store = store_for(full)
    sem = Slotted.semaphore(1)
    assert store.acquire(
        sem.key, "other", limit=1, lease=30, running=False, holder=None, park=None, job_class="x", args="",
        caller=local_holder(),
    ).status == "taken"  # fmt: skip
    with pytest.raises(ConcurrencyLimitExceeded):
        Slotted.run(1)
    assert keys(full.client, f"{full.namespace}:{{*}}:[qr]") == []


def test_a_parked_call_nested_past_recursion_is_refused_by_name_not_a_recursion_error() -> None:
    text = encode_call(Queued, (1,), {}, "k")
    deep = text.replace('"args":[1]', '"args":[' + "[" * 100_000 + "]" * 100_000 + "]")
    with pytest.raises(UnstorableCallError, match="nested too deeply"):
        decode_call(deep)
    tagged = text.replace('"args":[1]', '"args":[' + '{"$":"tuple","v":[' * 3000 + "]}" * 3000 + "]")
    with pytest.raises(UnstorableCallError, match="nested too deeply"):
        decode_call(tagged)


def test_discarding_parked_jobs_never_strands_their_locks_when_the_lock_step_fails(
    limited: Callable[[str], redis.Redis], full: RedisBackend, ns: str, redis_client: redis.Redis
) -> None:
    uniqjob.configure(full)
    Parking.enqueue(1)
    parked = Parking.enqueue(2)
    assert isinstance(parked, Parked)
    client = limited(f"{ns}:c:*")  # the line can be dropped; the parked jobs' locks cannot, yet
    assert discard_parked(parked.key, RedisBackend(client, namespace=ns)) == 1  # not a traceback
    assert undos.owns(parked.token)  # its lock is being dropped until the store lets it
    names = [u.decode() if isinstance(u, bytes) else str(u) for u in redis_client.acl_users()]
    user = next(name for name in names if name.startswith("uniqjob-limited-"))
    redis_client.acl_setuser(user, keys=[f"{ns}:*"])  # the store answers again
    undos.flush()
    assert not undos.owns(parked.token)
    assert Parking.lock(2).held() is False  # the discarded job's key is free


def test_a_sweep_goes_past_a_corrupt_key_and_logs_how_to_clear_it(
    full: RedisBackend, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_for(full)
    me = local_holder()
    dead = replace(me, pstart=me.pstart + 1)  # this pid, another start time: a holder long gone
    for key in ("a-bad", "b-good"):
        store.acquire(
            key,
            "t",
            limit=1,
            lease=60,
            running=True,
            holder=dead,
            park=None,
            job_class="x",
            args="",
            caller=me,
        )
    full.client.hset(f"{ns}:c:{{a-bad}}:slots", "t", "{not json")
    with caplog.at_level(logging.ERROR, logger="uniqjob.concurrency.semaphore"):
        assert sweep(full) == 1  # the good key's dead holder was reaped all the same
    assert "uniqjob release --force a-bad" in caplog.text
    assert store.read("b-good").empty
