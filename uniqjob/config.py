"""Where locks live by default, and backends made from URLs.

The one process-wide default is explicit and replaceable: :func:`configure`,
else the ``UNIQJOB_URL`` environment variable, else a file store in a per-user
state directory, so a script or cron job needs no server. A URL is made into
a store by the registry of :mod:`uniqjob.stores`; each store checks its own
URLs (``REDIS_URL_OPTIONS`` in :mod:`uniqjob.stores.redis`, ``FILE_URL_OPTIONS`` in
:mod:`uniqjob.stores.file`, ``MEMORY_URL_OPTIONS`` in :mod:`uniqjob.stores.memory`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

from . import stores
from .errors import ConfigurationError
from .stores.base import Backend

if TYPE_CHECKING:
    import redis

    #: What :func:`configure` takes besides a Backend and a URL: a redis-py client, made into a RedisBackend.
    RedisClient = redis.Redis | redis.RedisCluster

__all__ = [
    "backend_from_url",
    "configure",
    "default_backend",
    "default_directory",
    "default_is_implicit",
]

ENV_URL = "UNIQJOB_URL"

_mutex = threading.Lock()
_default: Backend | None = None
_implicit = False  # the default is the per-host file store nobody chose
_by_url: dict[str, Backend] = {}
_backend_types: set[type[Backend]] = set()


def default_directory() -> Path:
    """Return the default file store: ``$XDG_STATE_HOME/uniqjob`` or ``~/.local/state/uniqjob``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "uniqjob"


def backend_from_url(url: str) -> Backend:
    """Return a new backend for ``url``: ``redis://``, ``rediss://``, ``unix://``, ``file:///dir``, ``memory://``.

    Any scheme registered with :func:`uniqjob.stores.register` too. A malformed
    URL, or a query option the scheme does not support (see
    :data:`uniqjob.stores.redis.REDIS_URL_OPTIONS`, :data:`uniqjob.stores.file.FILE_URL_OPTIONS`), is a
    :class:`ConfigurationError` naming the problem.
    """
    return stores.from_url(url)


def resolve(target: str | Backend | RedisClient) -> Backend:
    """Return ``target`` if it is a backend, a RedisBackend on it if it is a redis-py (or valkey-py)
    client, else the backend of its URL (one per distinct URL)."""
    if type(target) in _backend_types:  # what isinstance() has said yes to: an ABC's check is slow
        return cast(Backend, target)
    if isinstance(target, Backend):
        _backend_types.add(type(target))
        return target
    module = type(target).__module__
    if module.partition(".")[0] in ("redis", "valkey"):
        if ".asyncio" in module:
            raise ConfigurationError(
                f"{module}.{type(target).__name__} is an asyncio client: configure a sync one "
                "(redis.Redis); the asyncio API makes its own async client from it"
            )
        from .stores.redis import RedisBackend  # the client's own module is loaded: so is redis-py

        return RedisBackend(target)
    if not isinstance(target, str):
        raise ConfigurationError(
            f"expected a Backend, a redis-py client or a URL string, got {type(target).__name__}"
        )
    with _mutex:
        backend = _by_url.get(target)
        if backend is None:
            backend = _by_url[target] = backend_from_url(target)
        return backend


def configure(target: str | Backend | RedisClient | None) -> Backend | None:
    """Set the process-wide default backend (a URL, a Backend or a redis-py client); None goes back to
    the environment."""
    global _default, _implicit
    backend = None if target is None else resolve(target)
    with _mutex:
        _default, _implicit = backend, False
    return backend


def default_is_implicit() -> bool:
    """True if the default store is the per-host file store nobody chose (no configure(), no UNIQJOB_URL)."""
    return _implicit or (_default is None and not os.environ.get(ENV_URL))


def default_backend() -> Backend:
    """Return the process-wide default backend, creating it on first use."""
    global _default, _implicit
    backend = _default
    if backend is not None:
        return backend
    url = os.environ.get(ENV_URL)
    try:
        chosen = resolve(url) if url else None
    except ConfigurationError as exc:
        raise ConfigurationError(f"the {ENV_URL} environment variable: {exc}") from None
    with _mutex:
        if _default is None:
            if chosen is None:
                from .stores.file import FileBackend

                chosen = FileBackend(default_directory())
                _implicit = True
            _default = chosen
        return _default
