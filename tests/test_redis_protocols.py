"""The Redis store on every client setting that changes what replies look like.

RESP2 and RESP3 (redis-py 8 speaks RESP3 when ``protocol`` is unset), with
``decode_responses`` on and off: every primitive of the lock store and of the
semaphore store, sync and asyncio, gives the same answers. A script that
returns nil works through the store's script path on RESP3, a client made with
redis-py's defaults works as the default store, and each primitive is one
``EVALSHA`` round trip (counted by the server: ``INFO commandstats``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import JobLock
from uniqjob.locks import Holder, QueueMeta, RunClaim, local_holder
from uniqjob.stores.aio import async_backend
from uniqjob.stores.redis import RedisBackend
from uniqjob.stores.redis._async import RedisAsync
from uniqjob.stores.redis._semaphores import RedisSemaphores

META = QueueMeta("tests.Job", "(1, 'é')")
CALLER = Holder("h", "n", 1, 1)
_spaces = itertools.count()


@pytest.fixture(
    params=[(2, False), (2, True), (3, False), (3, True)], ids=lambda p: f"resp{p[0]}-decode{p[1]:d}"
)
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[redis.Redis]:
    protocol, decode = request.param
    made = redis.Redis.from_url(redis_server.url, protocol=protocol, decode_responses=decode)
    yield made
    made.close()


@pytest.fixture
def backend(client: redis.Redis) -> RedisBackend:
    return RedisBackend(client, namespace=f"proto{next(_spaces)}")


def test_every_lock_primitive_answers_alike(backend: RedisBackend) -> None:
    key = "k:é"
    assert backend.claim(key, "t", meta=META, count=True) is None
    state = backend.claim(key, "u", meta=META, count=True)  # a duplicate: the holder's state
    assert state is not None and state.queue is not None
    assert (state.queue.token, state.queue.meta.args, state.queue.meta.cls) == ("t", "(1, 'é')", "tests.Job")
    assert backend.attach(key, "t", "job-1")
    run = RunClaim(local_holder(), 30.0, "a1")
    assert backend.start(key, "t", run=run, meta=META) is None and run.fence > 0
    assert backend.renew(key, "t", 30.0, "a1")
    read = backend.read(key)
    assert read.run is not None and read.run.fence == run.fence and read.run.holder == run.holder
    assert read.queue is not None and read.queue.meta.job_id == "job-1"
    assert [
        s.run.token if not isinstance(s, Exception) and s.run else None for s in backend.read_many([key, "x"])
    ] == [
        "t",
        None,
    ]
    assert list(backend.scan()) == [key]
    assert backend.duplicates() == {"tests.Job": 1}
    assert backend.requeue(key, "t", meta=META, ttl=None, attempt="a1")
    backend.finish(key, "t")
    assert backend.read(key).free
    assert backend.claim(key, "v", meta=META) is None
    assert backend.dequeue(key, "v")
    assert backend.claim(key, "w", meta=META) is None
    assert backend.reclaim(key, "w", None)
    assert backend.claim(key, "x", meta=META) is None
    assert backend.purge(key) == [f"{backend.namespace}:{{{key}}}:q"]


def test_every_semaphore_primitive_answers_alike(backend: RedisBackend) -> None:
    store = backend.semaphores()
    assert isinstance(store, RedisSemaphores)
    got = store.acquire(
        "s", "t1", limit=1, lease=30, running=True, holder=CALLER, park=None,
        job_class="tests.Job", args="é", caller=CALLER,
    )  # fmt: skip
    assert got.status == "taken"
    full = store.acquire(
        "s", "t2", limit=1, lease=30, running=True, holder=CALLER, park=None,
        job_class="tests.Job", args="", caller=CALLER,
    )  # fmt: skip
    assert full.status == "full" and [slot.token for slot in full.slots] == ["t1"]
    assert full.slots[0].args == "é" and full.slots[0].holder == CALLER
    state = store.read("s")
    assert state.limit == 1 and state.job_class == "tests.Job" and [s.token for s in state.slots] == ["t1"]
    assert store.renew("s", "t1", 30, caller=CALLER).status == "ok"
    assert store.release("s", "t1", caller=CALLER).status == "released"
    assert store.read("s").empty
    assert store.discard_parked("s") == []
    assert list(store.scan()) == []


def test_every_async_primitive_answers_alike(backend: RedisBackend) -> None:
    face = async_backend(backend)
    assert isinstance(face, RedisAsync)

    async def main() -> None:
        run = RunClaim(local_holder(), 30.0, "a1")
        assert await face.claim("k", "t", meta=META, run=run) is None and run.fence > 0
        state = await face.claim("k", "u", meta=META)
        assert state is not None and state.queue is not None and state.queue.meta.args == "(1, 'é')"
        assert await face.attach("k", "t", "job-1")
        assert await face.renew("k", "t", 30.0, "a1")
        read = await face.read("k")
        assert read.run is not None and read.run.fence == run.fence
        assert read.queue is not None and read.queue.token == "t"
        assert not hasattr(face, "call")  # no dispatch by name: each primitive is its own method
        many = await face.read_many(["k", "none"])
        assert [s.queue.token if not isinstance(s, Exception) and s.queue else None for s in many] == [
            "t",
            None,
        ]
        await face.finish("k", "t")
        assert (await face.read("k")).free
        await face.aclose()

    asyncio.run(main())


NIL = "return nil"


def test_a_script_that_returns_nil_works_on_either_protocol(backend: RedisBackend) -> None:
    # A kept connection's own parser once failed on RESP3's null ("unexpected reply type '_'").
    nil = backend.client.register_script(NIL)
    assert backend._eval(nil, 0, []) is None
    assert backend._eval(nil, 0, []) is None  # again, on a connection already used
    face = async_backend(backend)
    assert isinstance(face, RedisAsync)

    async def main() -> None:
        assert await face.wire().call(nil, 0, []) is None
        await face.aclose()

    asyncio.run(main())


def test_a_client_with_redis_py_s_defaults_is_the_default_store(redis_server: RedisServer) -> None:
    host, port = redis_server.url.removeprefix("redis://").split("/")[0].split(":")
    client = redis.Redis(host=host, port=int(port))  # nothing set: RESP3 on redis-py 8, bytes
    try:
        backend = RedisBackend(client, namespace="defaults")
        uniqjob.configure(backend)
        lock = JobLock(uniqjob.default_backend(), "k", meta=META)
        assert lock.acquire(run=True)
        assert not JobLock(backend, "k", meta=META).acquire()  # a duplicate, read on RESP3
        lock.release()
        assert backend.read("k").free
    finally:
        uniqjob.configure(None)
        client.close()


# -- one round trip per primitive ------------------------------------------------------------------


#: What a client sends of its own accord that no script of ours calls: none of these may come
#: beside a primitive's EVALSHA (the commands its script calls are counted too, so not compared).
_OWN = (
    "evalsha",
    "eval",
    "script|load",
    "ping",
    "hello",
    "client|setinfo",
    "wait",
    "multi",
    "exec",
    "select",
)


def _commands(admin: redis.Redis) -> dict[str, int]:
    """The calls since the last CONFIG RESETSTAT of each command a client sends of its own accord."""
    stats = admin.info("commandstats")
    counts = {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}
    return {name: n for name, n in counts.items() if name in _OWN}


def _counted(admin: redis.Redis, call: Callable[[], Any]) -> dict[str, int]:
    admin.config_resetstat()
    call()
    return _commands(admin)


def test_each_primitive_is_one_evalsha(backend: RedisBackend, redis_server: RedisServer) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    run = RunClaim(local_holder(), 30.0, "a1")
    backend.claim("warm", "w", meta=META)  # connected, the scripts loaded: nothing else to send
    backend.finish("warm", "w")
    backend.start("warm", "w", run=RunClaim(local_holder(), 30.0), meta=META)
    backend.renew("warm", "w", 30.0)
    backend.read("warm")
    backend.finish("warm", "w")
    calls: dict[str, Callable[[], Any]] = {
        "claim (fresh)": lambda: backend.claim("k", "t", meta=META),
        "claim (duplicate)": lambda: backend.claim("k", "u", meta=META),
        "start": lambda: backend.start("k", "t", run=run, meta=META),
        "renew": lambda: backend.renew("k", "t", 30.0),
        "read": lambda: backend.read("k"),
        "finish": lambda: backend.finish("k", "t"),
    }
    for name, call in calls.items():
        assert _counted(admin, call) == {"evalsha": 1}, name
    admin.close()


def test_each_async_primitive_is_one_evalsha(backend: RedisBackend, redis_server: RedisServer) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    face = async_backend(backend)
    assert isinstance(face, RedisAsync)

    async def main() -> None:
        await face.claim("warm", "w", meta=META)  # the loop's client connected, the scripts loaded
        await face.read("warm")
        await face.dequeue("warm", "w")
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "claim": lambda: face.claim("k", "t", meta=META),
            "duplicate": lambda: face.claim("k", "u", meta=META),
            "read": lambda: face.read("k"),
            "dequeue": lambda: face.dequeue("k", "t"),
        }
        for name, call in calls.items():
            admin.config_resetstat()
            await call()
            assert _commands(admin) == {"evalsha": 1}, name
        await face.aclose()

    asyncio.run(main())
    admin.close()


def test_a_url_store_s_new_connection_sends_nothing_before_its_first_call(redis_server: RedisServer) -> None:
    """RESP2 and no CLIENT SETINFO (docs/redis.md): a new connection's only command is the call.

    Sync and asyncio (whose client is made from the sync one's settings). What a connection
    sends of its own accord shows in ``INFO commandstats`` (``HELLO``, ``CLIENT SETINFO``) or,
    refused by a Redis older than 7.2, in ``INFO errorstats``: both stay as they were.
    """
    from uniqjob.stores import from_url

    admin = redis.Redis.from_url(redis_server.url)
    RedisBackend(admin).read("k")  # the script loaded: what follows is the call alone
    store = from_url(f"{redis_server.url}?namespace=quiet{next(_spaces)}")
    assert isinstance(store, RedisBackend)

    def sent(call: Callable[[], Any]) -> dict[str, int]:
        admin.config_resetstat()
        call()
        errors = {name: int(entry["count"]) for name, entry in admin.info("errorstats").items()}
        return {**_commands(admin), **errors}  # (the commands its scripts call left out)

    loop = asyncio.new_event_loop()
    try:
        assert sent(lambda: store.read("k")) == {"evalsha": 1}
        face = async_backend(store)
        assert sent(lambda: loop.run_until_complete(face.read("k"))) == {"evalsha": 1}
        loop.run_until_complete(face.aclose())
    finally:
        loop.close()
        store.close()
        admin.close()
