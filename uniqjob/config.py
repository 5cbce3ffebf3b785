"""Where locks live by default, and backends made from URLs.

The one process-wide default is explicit and replaceable: :func:`configure`,
else the ``UNIQJOB_URL`` environment variable, else a file store in a per-user
state directory, so a script or cron job needs no server.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import cast
from urllib.parse import unquote, urlsplit

from .backends.base import Backend
from .errors import ConfigurationError

__all__ = ["backend_from_url", "configure", "default_backend", "default_directory"]

ENV_URL = "UNIQJOB_URL"

_mutex = threading.Lock()
_default: Backend | None = None
_by_url: dict[str, Backend] = {}
_backend_types: set[type[Backend]] = set()


def default_directory() -> Path:
    """Return the default file store: ``$XDG_STATE_HOME/uniqjob`` or ``~/.local/state/uniqjob``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "uniqjob"


def backend_from_url(url: str) -> Backend:
    """Return a new backend for ``url``: ``redis://``, ``rediss://``, ``unix://``, ``file:///dir``, ``memory://``."""
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme in ("redis", "rediss", "unix"):
        from .backends.redis import RedisBackend

        return RedisBackend(url)
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ConfigurationError(f"bad file URL {url!r}: use file:///absolute/path/to/directory")
        from .backends.file import FileBackend

        return FileBackend(unquote(parts.path))
    if scheme == "memory":
        from .backends.memory import MemoryBackend

        return MemoryBackend()
    raise ConfigurationError(
        f"unsupported lock store URL {url!r}: expected redis://, rediss://, unix://, file:/// or memory://"
    )


def resolve(target: str | Backend) -> Backend:
    """Return ``target`` if it is a backend, else the backend of its URL (one per distinct URL)."""
    if type(target) in _backend_types:  # what isinstance() has said yes to: an ABC's check is slow
        return cast(Backend, target)
    if isinstance(target, Backend):
        _backend_types.add(type(target))
        return target
    if not isinstance(target, str):
        raise ConfigurationError(f"expected a Backend or a URL string, got {type(target).__name__}")
    with _mutex:
        backend = _by_url.get(target)
        if backend is None:
            backend = _by_url[target] = backend_from_url(target)
        return backend


def configure(target: str | Backend | None) -> Backend | None:
    """Set the process-wide default backend (a URL or a Backend); None goes back to the environment."""
    global _default
    backend = None if target is None else resolve(target)
    with _mutex:
        _default = backend
    return backend


def default_backend() -> Backend:
    """Return the process-wide default backend, creating it on first use."""
    global _default
    backend = _default
    if backend is not None:
        return backend
    url = os.environ.get(ENV_URL)
    chosen = resolve(url) if url else None
    with _mutex:
        if _default is None:
            if chosen is None:
                from .backends.file import FileBackend

                chosen = FileBackend(default_directory())
            _default = chosen
        return _default
