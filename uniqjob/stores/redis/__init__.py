"""The Redis store: locks shared by every host that talks to one server.

:class:`RedisBackend` (``_store``) calls one Lua script per primitive
(``_lua``) over a connection each thread keeps (``_transport``); its URLs (one server,
a cluster, a Sentinel service; Redis or Valkey) are checked by ``_url`` and
made into clients by ``_clients``. The class loads on first use, so a process that only
reads the URL options never imports redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._url import (
    REDIS_SCHEMES,
    REDIS_TIMEOUT,
    REDIS_URL_OPTIONS,
    RedisURL,
    from_url,
    parse,
    redis_client_from_url,
)

if TYPE_CHECKING:
    from ._store import RedisBackend

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
    if name == "RedisBackend":
        from ._store import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
