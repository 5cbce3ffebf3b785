"""Redis specifics: key layout, one round trip per transition, outages, client options."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import redis

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import BackendError, UniqueJob
from uniqjob.backends.redis import RedisBackend
from uniqjob.locks import LockState, QueueMeta, RunClaim, local_holder


class Job(UniqueJob):
    def perform(self, n: int) -> int:
        return n


def test_both_locks_share_a_hash_tag(redis_client: redis.Redis) -> None:
    backend = RedisBackend(redis_client)
    uniqjob.configure(backend)
    lock = Job.lock(1)
    assert lock.acquire(run=True)
    names = sorted(k.decode() for k in redis_client.scan_iter("*"))
    assert names == [f"uniqjob:{{{lock.key}}}:q", f"uniqjob:{{{lock.key}}}:r"]
    # Redis Cluster hashes the text between the first "{" and the next "}": one slot for both.
    tags = {n[n.index("{") + 1 : n.index("}", n.index("{"))] for n in names}
    assert len(tags) == 1
    assert redis_client.pttl(names[1]) > 0 and redis_client.pttl(names[0]) == -1
    lock.release()
    assert list(redis_client.scan_iter("*")) == []


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
    assert set(delta) <= {"time", "hget", "hmget", "hset", "hgetall", "del", "exists", "pexpire", "pttl"}


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
        redis_backend._state("k", reply)


def test_the_usual_duplicate_is_left_unread_until_used(redis_backend: RedisBackend) -> None:
    meta = QueueMeta("job", "1")
    assert redis_backend.claim("quiet", "t1", meta=meta) is None
    state = redis_backend.claim("quiet", "t2", meta=meta)
    assert state is not None and state.quiet
    assert state._read is not None  # rejected without building its records
    assert state.queue is not None and state.queue.token == "t1" and state.queue.meta == meta
    assert state.run is None and state._read is None
    assert state == LockState("quiet", state.queue, None, state.now)

    # A queued lock whose job a queue may prove gone is read at once, and is not quiet.
    assert redis_backend.attach("quiet", "t1", "job-1")
    named = redis_backend.claim("quiet", "t3", meta=meta)
    assert named is not None and not named.quiet and named._read is None
    assert named.queue is not None and named.queue.meta.job_id == "job-1"

    # So is one with a run lock beside it.
    run = RunClaim(local_holder(), 30.0, "a1")
    assert redis_backend.claim("busy", "t1", meta=meta, run=run) is None
    busy = redis_backend.claim("busy", "t2", meta=meta)
    assert busy is not None and not busy.quiet and busy.run is not None


def test_an_unread_state_that_is_unreadable_says_so_on_first_use(redis_backend: RedisBackend) -> None:
    state = redis_backend._state("k", b"Qnot json")
    assert state.quiet
    with pytest.raises(BackendError, match="unreadable lock state"):
        _ = state.queue
