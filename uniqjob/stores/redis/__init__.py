"""The Redis store: locks shared by every host that talks to one server.

:class:`RedisBackend` (``_store``) calls one Lua script per primitive
(``_lua``) through the client's public API (``_wire``: ``EVALSHA``, pipelines);
its URLs (one server, a cluster, a Sentinel service; Redis or Valkey) are
checked by ``_url`` and made into clients by ``_client``. Both load on first
use, so a process that only reads the URL options never imports redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._url import REDIS_SCHEMES, REDIS_TIMEOUT, REDIS_URL_OPTIONS, RedisURL, parse

if TYPE_CHECKING:
    from ._client import redis_client_from_url
    from ._store import RedisBackend, from_url

__all__ = [
    "REDIS_SCHEMES",
    "REDIS_TIMEOUT",
    "REDIS_URL_OPTIONS",
    "RedisBackend",
    "RedisURL",
    "from_url",
    "parse",
    "redis_client_from_url",
]


def __getattr__(name: str) -> Any:
    if name in ("RedisBackend", "from_url"):
        from . import _store

        return getattr(_store, name)
    if name == "redis_client_from_url":
        from . import _client

        return _client.redis_client_from_url
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
