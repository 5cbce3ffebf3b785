"""The Redis semaphore store's scripts: one clock with the lock scripts, records as 0.3.0 stored them."""

from __future__ import annotations

import inspect
import json
import re
import time
import uuid
from types import ModuleType
from typing import Any

import pytest
import redis

from uniqjob.locks import Holder
from uniqjob.stores.redis import RedisBackend, _lua, _lua_settle, _replies, _semaphore_lua
from uniqjob.stores.redis._lua import CLOCK
from uniqjob.stores.redis._semaphores import RedisSemaphores


def test_both_script_families_share_one_clock() -> None:
    assert CLOCK in _lua.CLAIM
    assert CLOCK in _semaphore_lua.ACQUIRE
    assert "local function clock()" not in _semaphore_lua.ACQUIRE.replace(CLOCK, "")


def test_a_slot_stored_in_milliseconds_by_0_3_0_is_read_as_it_was_meant(redis_client: redis.Redis) -> None:
    ns = f"sem{uuid.uuid4().hex[:8]}"
    store = RedisBackend(redis_client, namespace=ns).semaphores()
    now_ms = int(time.time() * 1000)
    slot = {
        "st": "running", "via": "inline", "h": "", "dl": now_ms + 30_000, "ls": 30_000,
        "since": now_ms - 5_000, "redo": 0, "args": "", "p": "",
    }  # fmt: skip
    redis_client.hset(f"{ns}:c:{{k}}:meta", mapping={"limit": 1, "cls": "x"})
    redis_client.hset(f"{ns}:c:{{k}}:slots", "t1", json.dumps(slot))
    state = store.read("k")
    assert abs(state.now - time.time()) < 5
    (info,) = state.slots
    assert info.lease == 30
    assert 25 < info.lease_left <= 30
    assert abs(info.since - (now_ms - 5_000) / 1000) < 0.01
    # and a step of the scripts keeps it: renewed in the same unit
    caller = Holder("h", "n", 1, 1)
    assert store.renew("k", "t1", 60, caller=caller).status == "ok"
    renewed = json.loads(redis_client.hget(f"{ns}:c:{{k}}:slots", "t1") or "{}")
    assert renewed["ls"] == 60_000
    assert abs(renewed["dl"] - (time.time() * 1000 + 60_000)) < 5_000


@pytest.mark.parametrize("module", [_lua, _semaphore_lua], ids=lambda m: m.__name__.rpartition(".")[2])
def test_every_script_states_its_keys_argv_and_reply_at_its_head(module: ModuleType) -> None:
    source = inspect.getsource(module)
    for name in module.__all__:
        value = getattr(module, name)
        if name in ("CORRUPT", "PRELUDE", "CHECKS", "CLOCK") or not isinstance(value, str):
            continue
        at = source.index(f"\n{name} = ")
        head = []
        for line in reversed(source[:at].splitlines()):
            if not line.startswith("#"):
                break
            head.append(line)
        text = " ".join(head)
        assert "KEYS" in text and "ARGV" in text and "Return" in text, name


def _pooled(client: redis.Redis, **kwargs: Any) -> redis.Redis:
    kw = client.connection_pool.connection_kwargs
    pool = redis.BlockingConnectionPool(host=kw["host"], port=kw["port"], **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    return redis.Redis(connection_pool=pool)


@pytest.mark.parametrize("path", ["plain", "pooled", "decoded"])
def test_the_semaphore_scripts_go_the_lock_stores_way_and_survive_a_script_flush(
    redis_client: redis.Redis, path: str
) -> None:
    ns = f"sem{uuid.uuid4().hex[:8]}"
    client = redis_client
    if path != "plain":
        client = _pooled(redis_client, decode_responses=path == "decoded")
    backend = RedisBackend(client, namespace=ns)
    store = backend.semaphores()
    assert isinstance(store, RedisSemaphores)
    assert store.client is backend.client  # one client, its one pool
    caller = Holder("h", "n", 1, 1)
    for n in range(3):
        if n == 1:
            redis_client.script_flush()
        token = f"t{n}"
        outcome = store.acquire(
            "k", token, limit=5, lease=30, running=True, holder=caller, park=None,
            job_class="x", args="", caller=caller,
        )  # fmt: skip
        assert outcome.status == "taken"
        state = store.read("k")
        assert {slot.token for slot in state.slots} == {f"t{i}" for i in range(n + 1)}
    assert store.release("k", "t0", caller=caller).status == "released"
    backend.close()


def _names(line: str) -> tuple[str, ...]:
    """The names a header's ``ARGV:`` lists, without their notes in parentheses."""
    text = re.sub(r"\([^)]*\)", "", line)
    return tuple(name.strip() for name in text.split(","))


def test_the_lock_scripts_argv_and_snapshot_are_read_by_the_names_of_one_table() -> None:
    source = inspect.getsource(_lua) + inspect.getsource(_lua_settle)
    for name, argv in (
        ("CLAIM", _lua.CLAIM_ARGV),
        ("START", _lua.START_ARGV),
        ("REQUEUE", _lua.REQUEUE_ARGV),
    ):
        head = source[: source.index(f"\n{name} = ")].rpartition("# KEYS:")[2]
        listed = re.sub(r"\s*#\s*", " ", head.partition("ARGV:")[2]).partition(".")[0]
        listed = listed.partition("\n")[0] if name == "REQUEUE" else listed
        names = _names(listed.split("flags:")[0].split("Returns")[0])
        assert names == argv, name
    store = inspect.getsource(_replies)
    assert ", ".join(_lua.QUEUE_FIELDS) + " = fields" in store
    assert ", ".join(_lua.RUN_FIELDS) + " = fields" in store
    assert ", ".join(_lua.SNAPSHOT) + " = _scan_json(" in store
    letters = ", ".join(f"'{letter}'" for letter in _lua.QUEUE_FIELDS.values())
    assert f"redis.pcall('HMGET', KEYS[1], {letters})" in _lua.CLAIM


def _elements(table: str) -> int:
    """How many elements a Lua table constructor's text (braces included) holds at its top level."""
    depth = count = 0
    for char in table:
        depth += char in "{(["
        depth -= char in "})]"
        count += char == "," and depth == 1
    return count + (table.strip("{} \n") != "")


def _tables(body: str, opening: str) -> list[str]:
    """Every table constructor in ``body`` that follows ``opening`` (e.g. ``return {``), braces included."""
    found = []
    for at in (m.end() - 1 for m in re.finditer(re.escape(opening), body)):
        depth = 0
        for end in range(at, len(body)):
            depth += body[end] == "{"
            depth -= body[end] == "}"
            if depth == 0:
                found.append(body[at : end + 1])
                break
    return found


def test_the_semaphore_scripts_replies_are_read_by_the_names_their_heads_state() -> None:
    source = inspect.getsource(_semaphore_lua)
    stated = {}
    for name in _semaphore_lua.__all__:
        if name == "PRELUDE":
            continue
        head = source[: source.index(f"\n{name} = (")].rpartition("# KEYS:")[2]
        replied = re.search(r"Returns \{(.*?)\}", re.sub(r"\n#\s*", " ", head), re.S)
        if replied is not None:
            stated[name] = _names(replied.group(1))
    assert stated == {name: reply._fields for name, reply in _replies.REPLIES.items()}  # type: ignore[attr-defined]
    for name, fields in stated.items():  # and each script returns that many fields, wherever it returns
        body = getattr(_semaphore_lua, name)[len(_semaphore_lua.PRELUDE) :]
        returns = _tables(body, "return {")
        assert returns and {_elements(t) for t in returns} == {len(fields)}, name
    promotion = re.search(r"a promotion is \{(.*?)\}", source)
    assert promotion is not None and _names(promotion.group(1)) == _replies.Promoted._fields
    made = _tables(_semaphore_lua.PRELUDE, "promos[#promos + 1] = {")
    assert len(made) == 2 and {_elements(t) for t in made} == {len(_replies.Promoted._fields)}
