"""Redis URLs: the options they may carry, checked before anything connects.

Nothing here imports redis-py until a client is made, so the options and the
checks are readable from a process that never talks to Redis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ...errors import ConfigurationError
from .._urls import Invalid, bad, flag, options, plain_text, scheme_of, seconds, split, whole

if TYPE_CHECKING:
    import redis

    from ._store import RedisBackend

__all__ = ["REDIS_TIMEOUT", "REDIS_URL_OPTIONS", "from_url", "redis_client_from_url"]

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

#: Redis URL sockets time out after this many seconds unless the URL says otherwise.
REDIS_TIMEOUT = 5.0


def _redis_kwargs(url: str, timeout: float) -> tuple[str, dict[str, Any]]:
    """Check a Redis URL; return its scheme and the keyword arguments of its connections."""
    parts = split(url)
    scheme = parts.scheme.lower()
    given = options(parts, REDIS_URL_OPTIONS)
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if scheme == "unix":
        if parts.hostname not in (None, "", "localhost"):
            raise Invalid("a unix:// URL names a socket by its absolute path: unix:///path/to/redis.sock")
        path = unquote(parts.path)
        if not path or path == "/":
            raise Invalid("no socket path: use unix:///path/to/redis.sock")
        if "\x00" in path:
            raise Invalid("the socket path holds a NUL byte (%00)")
        kwargs["path"] = path
    else:
        host = unquote(parts.hostname or "") or "localhost"
        kwargs["host"] = plain_text("the host", host)  # a NUL byte too
        if parts.port is not None:
            if parts.port == 0:
                raise Invalid("port 0 is not a port to connect to (use 1-65535)")
            kwargs["port"] = parts.port
        db = unquote(parts.path)[1:]
        if db:
            if "db" in given:
                raise Invalid(f"the database is given twice: as the path /{db} and as ?db=")
            kwargs["db"] = whole("the path", db, "a database number, e.g. /0")
    if parts.username:
        kwargs["username"] = plain_text("the user name", unquote(parts.username))
    if parts.password:
        kwargs["password"] = unquote(parts.password)
    if "timeout" in given:  # both at once, first: either may also be given on its own
        kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = seconds("timeout", given["timeout"])
    for name, value in given.items():
        if name != "timeout":
            kwargs.update(_redis_option(scheme, name, value, kwargs))
    return scheme, kwargs


def _redis_option(scheme: str, name: str, value: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The connection keyword arguments one query option sets."""
    if name.startswith("ssl_") and scheme != "rediss":
        raise Invalid(f"option {name!r} needs a rediss:// URL")
    if name in ("username", "password") and name in kwargs:
        raise Invalid(f"the {name} is given twice: before the host and as ?{name}=")
    if name == "db":
        return {"db": whole("option 'db'", value, "a database number, 0 or more")}
    if name in ("socket_timeout", "socket_connect_timeout"):
        return {name: seconds(name, value)}
    if name == "health_check_interval":
        return {name: whole(f"option {name!r}", value, "a whole number of seconds")}
    if name == "ssl_check_hostname":
        return {name: flag(name, value)}
    if name == "ssl_cert_reqs":
        if value.lower() not in ("none", "optional", "required"):
            raise Invalid(f"option 'ssl_cert_reqs' must be none, optional or required, got {value!r}")
        return {name: value.lower()}
    if name == "client_name" and (" " in value or not value.isprintable()):
        raise Invalid(f"option 'client_name' may hold no spaces or control characters, got {value!r}")
    return {name: plain_text(f"option {name!r}", value) if name != "password" else value}


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
    scheme = scheme_of(url)
    if scheme not in ("redis", "rediss", "unix"):
        raise bad("Redis", url, "expected redis://host:port/db, rediss://... or unix:///path/to/redis.sock")
    try:
        scheme, kwargs = _redis_kwargs(url, float(timeout))
    except Invalid as exc:
        raise bad("Redis", url, exc) from None
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


def from_url(url: str) -> RedisBackend:
    """A new RedisBackend for a ``redis://``, ``rediss://`` or ``unix://`` URL, checked first."""
    client = redis_client_from_url(url, timeout=REDIS_TIMEOUT)
    from ._store import RedisBackend

    return RedisBackend(client, timeout=REDIS_TIMEOUT)
