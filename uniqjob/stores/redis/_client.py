"""What both Redis stores need to know about a client, whatever kind it is.

A client is a redis-py ``Redis`` (on a plain, blocking or Sentinel pool), a
``RedisCluster``, or valkey-py's ``Valkey`` / ``ValkeyCluster``, which are
redis-py's forks with exception classes of their own. This module:

- describes a client for messages (:func:`where`): its server and database,
  the Sentinel service and its Sentinels, or a cluster's nodes; never raises;
- tells the client library's own errors from anything else (:func:`is_client_error`,
  :func:`is_response_error`), whichever library raised them, and words a URL's mistake
  (no password, a wrong one, no such database) as its fix (:func:`backend_error`);
- names the Redis keys of a user's key so that all of them share one
  cluster slot, and reads the key back from a name (:func:`names`, :func:`key_of`).
"""

from __future__ import annotations

import itertools
import sys
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import redis

from ...errors import BackendError, StoreRefusedURLError

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    #: A client the stores take: redis-py's, on one server or a cluster (valkey-py's are alike, untyped).
    Client: TypeAlias = redis.Redis | RedisCluster

__all__ = [
    "NEEDS_PASSWORD",
    "NO_SUCH_DB",
    "WRONG_PASSWORD",
    "Client",
    "backend_error",
    "is_client_error",
    "is_response_error",
    "key_of",
    "names",
    "where",
]


def where(client: Any) -> str:
    """Where ``client`` talks to, for messages: never raises, whatever kind of client it is."""
    try:
        pool = getattr(client, "connection_pool", None)
        service = getattr(pool, "service_name", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        db = kwargs.get("db", 0) if isinstance(kwargs, dict) else 0
        if isinstance(service, str):  # a Sentinel pool: its connections carry no host
            sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
            return f"Sentinel service {service!r} via [{_shown(_address(s) for s in sentinels)}], db={db}"
        if isinstance(kwargs, dict):
            spot = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
            return f"{spot!r}, db={db}"
        get_nodes = getattr(client, "get_nodes", None)  # a cluster client: no one pool
        if callable(get_nodes):
            # redis-py 5 forgets its nodes and seeds when the cluster cannot be reached: the
            # node it last used (its default node) is what it still knows
            manager = client.nodes_manager
            nodes = list(get_nodes()) or list(manager.startup_nodes.values()) or [manager.default_node]
            return f"cluster [{_shown(str(getattr(node, 'name', node)) for node in nodes)}]"
        # a client of another kind that says what it is
        if type(client).__repr__ is not object.__repr__:  # type: ignore[comparison-overlap]
            return repr(client)[:120]
    except Exception:  # a description must not fail the call it describes
        pass
    return f"a {type(client).__name__} client"


def _address(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


def _shown(items: Any, most: int = 3) -> str:
    first = list(itertools.islice(items, most + 1))
    return ", ".join(first[:most]) + (", ..." if len(first) > most else "")


def _classes(name: str) -> tuple[type[BaseException], ...]:
    """redis-py's exception class ``name``, and valkey-py's if valkey-py is loaded (a client exists)."""
    found: list[type[BaseException]] = [getattr(redis.exceptions, name)]
    valkey = sys.modules.get("valkey.exceptions")
    if valkey is not None and hasattr(valkey, name.replace("Redis", "Valkey")):
        found.append(getattr(valkey, name.replace("Redis", "Valkey")))
    return tuple(found)


def is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the client library's own error (redis-py's or valkey-py's), not a bug's."""
    # A cluster client's RedisClusterException is no RedisError.
    return isinstance(exc, _classes("RedisError") + _classes("RedisClusterException"))


NEEDS_PASSWORD = (
    "the server needs a password: put it in the URL (redis://:PASSWORD@HOST:6379/0, or ?password=...)"
)
WRONG_PASSWORD = "the server refused the user name or password in the URL: check them"
NO_SUCH_DB = "the server has no database of the URL's number (its `databases` setting; 16 by default)"
# The server's words for each mistake of a URL (RESP3's HELLO, RESP2's commands): redis-py passes
# them through, and asked for nothing but a password a server speaks of HELLO and AUTH.
_URL_MISTAKES = {
    "HELLO must be called with the client already authenticated": NEEDS_PASSWORD,
    "NOAUTH": NEEDS_PASSWORD,
    "Authentication required": NEEDS_PASSWORD,
    "WRONGPASS": WRONG_PASSWORD,
    "invalid username-password pair": WRONG_PASSWORD,
    "invalid password": WRONG_PASSWORD,
    "DB index is out of range": NO_SUCH_DB,
    "ERR DB index is out of range": NO_SUCH_DB,
}


def backend_error(exc: Exception, owner: object, store: str) -> BackendError:
    """The BackendError a caller of ``owner`` (a store) sees for ``exc``; raise it ``from exc``.

    The client library's own error keeps its text; anything else (a bug in a wire
    path, a client of an unknown kind) is named by its class too.
    """
    if isinstance(exc, BackendError):
        return exc
    text = str(exc) or type(exc).__name__
    if not is_client_error(exc):
        text = f"{type(exc).__name__}: {text}"
    else:
        for start, mistake in _URL_MISTAKES.items():
            if text.startswith(start):
                return StoreRefusedURLError(f"{mistake} ({owner!r})", store)
    return BackendError(f"{text} ({owner!r})", store)


def is_response_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply of the server, as redis-py or valkey-py raises it."""
    return isinstance(exc, _classes("ResponseError"))


# -- names: one slot per key -------------------------------------------------------------
#
# A key's Redis names are ``<prefix>{<key>}:<part>``: the hash tag (the text between the
# first "{" and the next "}") is the key, or its start up to a "}" inside it, the same for
# every part, so one slot. A key that starts with "}" (or is empty) would give an empty tag,
# which Redis ignores, hashing each whole name on its own: such a key is named
# ``<prefix>~{<crc32 hex>}<key>:<part>`` instead. No ordinary name has "~{" after the
# prefix (it has "{"), so the two forms never meet, and ordinary keys keep the names they had.

_ESCAPED = "~{"


def names(prefix: str, key: str, parts: Sequence[str]) -> list[str]:
    """The Redis names of ``key``'s ``parts`` under ``prefix``, all in one cluster slot."""
    if key[:1] not in ("}", ""):
        base = f"{prefix}{{{key}}}:"
    else:
        base = f"{prefix}{_ESCAPED}{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}}}{key}:"
    return list(map(base.__add__, parts))  # (not a comprehension: in 3.11 that is a call of its own)


def key_of(prefix: str, name: str, part: str) -> str | None:
    """The key whose ``part`` is named ``name`` (see :func:`names`); None if ``name`` is not one."""
    if not (name.startswith(prefix) and name.endswith(":" + part)):
        return None
    body = name[len(prefix) : -len(part) - 1]
    if body.startswith(_ESCAPED):
        tag_end = body.find("}", len(_ESCAPED))
        return body[tag_end + 1 :] if tag_end > 0 else None
    if body.startswith("{") and body.endswith("}") and len(body) >= 3 and body[1] != "}":
        return body[1:-1]
    return None
