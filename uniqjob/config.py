"""Where locks live by default, and backends made from URLs.

The one process-wide default is explicit and replaceable: :func:`configure`,
else the ``UNIQJOB_URL`` environment variable, else a file store in a per-user
state directory, so a script or cron job needs no server.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import SplitResult, unquote, unquote_plus, urlsplit

from .errors import ConfigurationError
from .stores.base import Backend

if TYPE_CHECKING:
    import redis

__all__ = [
    "FILE_URL_OPTIONS",
    "REDIS_URL_OPTIONS",
    "backend_from_url",
    "configure",
    "default_backend",
    "default_directory",
    "redis_client_from_url",
]

ENV_URL = "UNIQJOB_URL"

_mutex = threading.Lock()
_default: Backend | None = None
_by_url: dict[str, Backend] = {}
_backend_types: set[type[Backend]] = set()


def default_directory() -> Path:
    """Return the default file store: ``$XDG_STATE_HOME/uniqjob`` or ``~/.local/state/uniqjob``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "uniqjob"


#: The query options a ``redis://``, ``rediss://`` or ``unix://`` URL may carry, and
#: what each means; any other is refused by name. Values are percent-decoded.
REDIS_URL_OPTIONS: dict[str, str] = {
    "db": "database number, 0 or more (redis:// and rediss:// may give it as the path: /2)",
    "timeout": "seconds, both socket timeouts at once (default 5)",
    "socket_timeout": "seconds to wait for a reply (default: timeout)",
    "socket_connect_timeout": "seconds to wait for a connection (default: timeout)",
    "username": "ACL user (also user@ before the host)",
    "password": "password (also :password@ before the host)",
    "client_name": "the name CLIENT LIST shows for the connections, no spaces",
    "health_check_interval": "whole seconds between redis-py's PINGs of an idle connection (default 0: off)",
    "ssl_cert_reqs": "rediss:// only: none, optional or required (default)",
    "ssl_ca_certs": "rediss:// only: file of CA certificates to trust",
    "ssl_certfile": "rediss:// only: client certificate file",
    "ssl_keyfile": "rediss:// only: client private key file",
    "ssl_check_hostname": "rediss:// only: true (default) or false",
}

#: The query options a ``file://`` URL may carry.
FILE_URL_OPTIONS: dict[str, str] = {
    "timeout": "seconds to wait for the file lock of a key's stripe (default 30)",
}

#: A ``memory://`` URL carries none.
MEMORY_URL_OPTIONS: dict[str, str] = {}

#: Redis URL sockets time out after this many seconds unless the URL says otherwise.
REDIS_TIMEOUT = 5.0

_SCHEMES = "redis://, rediss://, unix://, file:/// or memory://"
_SECRET_USERINFO = re.compile(r"(?<=://)([^/?#@]*?):[^/?#@]*@")
_SECRET_OPTION = re.compile(r"(?<=[?&]password=)[^&#]*")


def _scheme(url: str) -> str:
    """The scheme of ``url``, lowercased ("" if none), read without parsing the rest."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


class _Invalid(Exception):
    """One thing wrong with a URL; :func:`_bad` turns it into the ConfigurationError people see."""


def _shown(url: str) -> str:
    """``url`` quoted for a message, any password in it masked."""
    return repr(_SECRET_OPTION.sub("***", _SECRET_USERINFO.sub(r"\1:***@", url)))


def _bad(kind: str, url: str, reason: object) -> ConfigurationError:
    return ConfigurationError(f"bad {kind} URL {_shown(url)}: {reason}")


def _split(url: str) -> SplitResult:
    """Split ``url``, checking its host and port; raise _Invalid naming what is malformed."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for its check: a port that is not a number 0-65535 raises
    except ValueError as exc:
        reason = str(exc)
        if reason == "Invalid IPv6 URL":
            reason = "the host is not a well-formed [IPv6] address (a bracket is missing)"
        elif reason.startswith("Port"):  # "could not be cast to integer", "out of range 0-65535"
            reason = f"the port must be a number 1-65535 ({reason})"
        raise _Invalid(reason) from None
    if parts.fragment or url.endswith("#"):
        raise _Invalid(
            "'#' starts a URL fragment, which means nothing here (write a '#' in a password as %23)"
        )
    return parts


def _options(parts: SplitResult, allowed: Mapping[str, str]) -> dict[str, str]:
    """The URL's query options by name, each given once with a value, all of them in ``allowed``."""
    found: dict[str, str] = {}
    for item in parts.query.split("&") if parts.query else ():
        if not item:
            continue  # "?a=1&": an empty item says nothing
        raw_name, sep, raw_value = item.partition("=")
        name, value = unquote_plus(raw_name), unquote_plus(raw_value)
        if name not in allowed:
            supported = ", ".join(allowed) if allowed else "none"
            raise _Invalid(f"unknown option {name!r} (supported: {supported})")
        if not sep or not value:
            raise _Invalid(f"option {name!r} needs a value ({name}=...)")
        if name in found:
            raise _Invalid(f"option {name!r} is given twice")
        found[name] = value
    return found


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise _Invalid(f"option {name!r} must be a number of seconds > 0, got {text!r}")
    return value


def _whole(name: str, text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise _Invalid(f"{name} must be {what}, got {text!r}")
    return int(text)


def _flag(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "yes", "no", "1", "0"):
        raise _Invalid(f"option {name!r} must be true or false, got {text!r}")
    return lowered in ("true", "yes", "1")


def _plain_text(name: str, text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise _Invalid(f"{name} holds a control character")
    return text


def _redis_kwargs(url: str, timeout: float) -> tuple[str, dict[str, Any]]:
    """Check a Redis URL; return its scheme and the keyword arguments of its connections."""
    parts = _split(url)
    scheme = parts.scheme.lower()
    options = _options(parts, REDIS_URL_OPTIONS)
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if scheme == "unix":
        if parts.hostname not in (None, "", "localhost"):
            raise _Invalid("a unix:// URL names a socket by its absolute path: unix:///path/to/redis.sock")
        path = unquote(parts.path)
        if not path or path == "/":
            raise _Invalid("no socket path: use unix:///path/to/redis.sock")
        if "\x00" in path:
            raise _Invalid("the socket path holds a NUL byte (%00)")
        kwargs["path"] = path
    else:
        host = unquote(parts.hostname or "") or "localhost"
        kwargs["host"] = _plain_text("the host", host)  # a NUL byte too
        if parts.port is not None:
            if parts.port == 0:
                raise _Invalid("port 0 is not a port to connect to (use 1-65535)")
            kwargs["port"] = parts.port
        db = unquote(parts.path)[1:]
        if db:
            if "db" in options:
                raise _Invalid(f"the database is given twice: as the path /{db} and as ?db=")
            kwargs["db"] = _whole("the path", db, "a database number, e.g. /0")
    if parts.username:
        kwargs["username"] = _plain_text("the user name", unquote(parts.username))
    if parts.password:
        kwargs["password"] = unquote(parts.password)
    if "timeout" in options:  # both at once, first: either may also be given on its own
        kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = _seconds("timeout", options["timeout"])
    for name, value in options.items():
        if name != "timeout":
            kwargs.update(_redis_option(scheme, name, value, kwargs))
    return scheme, kwargs


def _redis_option(scheme: str, name: str, value: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The connection keyword arguments one query option sets."""
    if name.startswith("ssl_") and scheme != "rediss":
        raise _Invalid(f"option {name!r} needs a rediss:// URL")
    if name in ("username", "password") and name in kwargs:
        raise _Invalid(f"the {name} is given twice: before the host and as ?{name}=")
    if name == "db":
        return {"db": _whole("option 'db'", value, "a database number, 0 or more")}
    if name in ("socket_timeout", "socket_connect_timeout"):
        return {name: _seconds(name, value)}
    if name == "health_check_interval":
        return {name: _whole(f"option {name!r}", value, "a whole number of seconds")}
    if name == "ssl_check_hostname":
        return {name: _flag(name, value)}
    if name == "ssl_cert_reqs":
        if value.lower() not in ("none", "optional", "required"):
            raise _Invalid(f"option 'ssl_cert_reqs' must be none, optional or required, got {value!r}")
        return {name: value.lower()}
    if name == "client_name" and (" " in value or not value.isprintable()):
        raise _Invalid(f"option 'client_name' may hold no spaces or control characters, got {value!r}")
    return {name: _plain_text(f"option {name!r}", value) if name != "password" else value}


def redis_client_from_url(url: str, *, timeout: float) -> redis.Redis:
    """Return a redis-py client for a ``redis://``, ``rediss://`` or ``unix://`` URL, checked first.

    Both socket timeouts default to ``timeout`` seconds, so a call to an
    unreachable server fails in bounded time. The URL may carry the query
    options of :data:`REDIS_URL_OPTIONS` and no others. Anything malformed (a
    bad host, port or database, an unknown option or a bad value, a unix URL
    with no socket path, a NUL byte) is a :class:`ConfigurationError` naming
    it, with any password in the URL masked. Nothing connects yet.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"expected a Redis URL string, got {type(url).__name__}")
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    scheme = _scheme(url)
    if scheme not in ("redis", "rediss", "unix"):
        raise _bad("Redis", url, "expected redis://host:port/db, rediss://... or unix:///path/to/redis.sock")
    try:
        scheme, kwargs = _redis_kwargs(url, float(timeout))
    except _Invalid as exc:
        raise _bad("Redis", url, exc) from None
    import redis  # here: a process whose locks are in files never loads redis
    from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection

    kind: type[Connection | UnixDomainSocketConnection] = Connection
    if scheme == "rediss":
        kind = SSLConnection
    elif scheme == "unix":
        kind = UnixDomainSocketConnection
    # As redis.Redis.from_url builds it: a plain pool of the scheme's connections, closed with the client.
    pool = redis.ConnectionPool(connection_class=kind, **kwargs)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def _file_backend(url: str) -> Backend:
    """The FileBackend of a ``file:///dir`` URL, checked first."""
    try:
        parts = _split(url)
        options = _options(parts, FILE_URL_OPTIONS)
    except _Invalid as exc:
        raise _bad("file", url, exc) from None
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise _bad("file", url, "use file:///absolute/path/to/directory")
    path = unquote(parts.path)
    if "\x00" in path:
        raise _bad("file", url, "the path holds a NUL byte (%00)")
    if os.path.normpath(path).strip("/") == "":
        raise _bad(
            "file",
            url,
            "refusing / as a lock store (its .locks directory would go into the root directory); "
            "name a directory of its own, e.g. file:///var/lib/myapp/locks",
        )
    try:
        timeout = _seconds("timeout", options["timeout"]) if "timeout" in options else None
    except _Invalid as exc:
        raise _bad("file", url, exc) from None
    from .stores.file import FileBackend

    return FileBackend(path) if timeout is None else FileBackend(path, timeout=timeout)


def _memory_backend(url: str) -> Backend:
    """A new MemoryBackend for ``memory://``, which takes no host, path or option."""
    try:
        parts = _split(url)
        _options(parts, MEMORY_URL_OPTIONS)
    except _Invalid as exc:
        raise _bad("memory", url, exc) from None
    if parts.netloc or parts.path:
        raise _bad("memory", url, "memory:// takes no host or path")
    from .stores.memory import MemoryBackend

    return MemoryBackend()


def backend_from_url(url: str) -> Backend:
    """Return a new backend for ``url``: ``redis://``, ``rediss://``, ``unix://``, ``file:///dir``, ``memory://``.

    A malformed URL, or a query option the scheme does not support (see
    :data:`REDIS_URL_OPTIONS`, :data:`FILE_URL_OPTIONS`), is a
    :class:`ConfigurationError` naming the problem.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"expected a lock store URL string, got {type(url).__name__}")
    scheme = _scheme(url)
    if scheme in ("redis", "rediss", "unix"):
        client = redis_client_from_url(url, timeout=REDIS_TIMEOUT)
        from .stores.redis import RedisBackend

        return RedisBackend(client, timeout=REDIS_TIMEOUT)
    if scheme == "file":
        return _file_backend(url)
    if scheme == "memory":
        return _memory_backend(url)
    raise ConfigurationError(f"unsupported lock store URL {_shown(url)}: expected {_SCHEMES}")


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
    try:
        chosen = resolve(url) if url else None
    except ConfigurationError as exc:
        raise ConfigurationError(f"the {ENV_URL} environment variable: {exc}") from None
    with _mutex:
        if _default is None:
            if chosen is None:
                from .stores.file import FileBackend

                chosen = FileBackend(default_directory())
            _default = chosen
        return _default
