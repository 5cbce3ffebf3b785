"""The Redis store: locks shared by every host that talks to one server.

:class:`RedisBackend` (``_store``) calls one Lua script per primitive
(``_lua``) over a connection each thread keeps (``_transport``). The class
loads on first use, so a process that only reads this package's names never
imports redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._store import RedisBackend

__all__ = ["RedisBackend"]


def __getattr__(name: str) -> Any:
    if name == "RedisBackend":
        from ._store import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
