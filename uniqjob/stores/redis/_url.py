"""Redis URLs: the forms and options they may carry, checked before anything connects.

:func:`parse` reads every form (one server, a Redis Cluster, a service behind
Sentinel; Redis or Valkey; plain or TLS) into a :class:`RedisURL`, and
``_client`` builds the client it describes. Nothing here imports redis-py,
so the options and the checks are readable from a process that never talks
to Redis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, unquote

from ...errors import ConfigurationError
from .._urls import (
    REDIS_SCHEMES,
    Invalid,
    Topology,
    bad,
    flag,
    nodes,
    options,
    plain_text,
    scheme_of,
    seconds,
    split,
    split_hosts,
    whole,
)

__all__ = [
    "MAX_REPLICAS",
    "REDIS_SCHEMES",
    "REDIS_TIMEOUT",
    "REDIS_URL_OPTIONS",
    "RedisURL",
    "check_store_options",
    "namespace_problem",
    "parse",
    "replicas_problem",
]

#: The query options a Redis or Valkey URL may carry, and what each means; any
#: other is refused by name. Values are percent-decoded.
REDIS_URL_OPTIONS: dict[str, str] = {
    "db": "database number, 0 or more (also as the path: /2); a cluster has only 0",
    "timeout": "seconds, both socket timeouts at once (default 5)",
    "socket_timeout": "seconds to wait for a reply (default: timeout)",
    "socket_connect_timeout": "seconds to wait for a connection (default: timeout)",
    "username": "ACL user (also user@ before the host)",
    "password": "password (also :password@ before the host)",
    "client_name": "the name CLIENT LIST shows for the connections, no spaces",
    "health_check_interval": "whole seconds between PINGs of an idle connection (default 0: off); no cluster",
    "namespace": "the prefix of every Redis key of the store, no '{' or '}' (default uniqjob)",
    "replicas": "replicas that must acknowledge each grant (Redis WAIT), 0 to 64 (default 0: none)",
    "replica_timeout": "seconds to wait for that acknowledgement before the grant is undone (default 1)",
    "sentinel_username": "+sentinel URLs only: ACL user of the Sentinels (user@ is the master's)",
    "sentinel_password": "+sentinel URLs only: password of the Sentinels (:password@ is the master's)",
    "ssl_cert_reqs": "TLS URLs only (rediss, valkeys, ...): none, optional or required (default)",
    "ssl_ca_certs": "TLS URLs only: file of CA certificates to trust",
    "ssl_certfile": "TLS URLs only: client certificate file",
    "ssl_keyfile": "TLS URLs only: client private key file",
    "ssl_check_hostname": "TLS URLs only: true (default) or false",
}

#: Redis URL sockets time out after this many seconds unless the URL says otherwise.
REDIS_TIMEOUT = 5.0

_STORE_OPTIONS = ("namespace", "replicas", "replica_timeout")

#: The most replicas a grant may wait for (``replicas=``): more than any master has.
MAX_REPLICAS = 64


def namespace_problem(namespace: object, name: str = "namespace") -> str | None:
    """What is wrong with ``namespace`` as a Redis store's key prefix; None if nothing.

    A namespace is a non-empty string with no ``{`` or ``}`` (they would set the
    cluster slot of every key, and let two namespaces name the same keys) and
    no control character.
    """
    if not isinstance(namespace, str) or not namespace:
        return f"{name} must be a non-empty string, got {namespace!r}"
    if "{" in namespace or "}" in namespace:
        return f"{name} may hold no '{{' or '}}' (they set cluster slots), got {namespace!r}"
    if any(ord(c) < 32 or ord(c) == 127 for c in namespace):
        return f"{name} holds a control character, got {namespace!r}"
    return None


def replicas_problem(replicas: object, name: str = "replicas") -> str | None:
    """What is wrong with ``replicas`` (how many replicas acknowledge each grant); None if nothing."""
    if type(replicas) is not int or not 0 <= replicas <= MAX_REPLICAS:
        return f"{name} must be a whole number from 0 to {MAX_REPLICAS}, got {replicas!r}"
    return None


_DEFAULT_PORT = {"server": 6379, "cluster": 6379, "sentinel": 26379}
_KIND = {"server": "", "cluster": " Cluster", "sentinel": " Sentinel"}


@dataclass
class RedisURL:
    """What a Redis or Valkey URL says: where to connect, how, and the store's own settings."""

    scheme: str
    flavor: str  # "redis" or "valkey": the store's name in messages
    tls: bool
    topology: Topology
    #: Keyword arguments of every connection to the data: the server, each cluster node, the master.
    connection: dict[str, Any]
    #: The cluster's seed nodes, or the Sentinels: (host, port) pairs; none for one server.
    nodes: list[tuple[str, int]] = field(default_factory=list)
    service: str = ""  # the Sentinel service (master name)
    #: Keyword arguments of each connection to a Sentinel.
    sentinel: dict[str, Any] = field(default_factory=dict)
    namespace: str = "uniqjob"
    replicas: int = 0
    replica_timeout: float = 1.0
    #: Which of the store's own options (namespace, replicas, replica_timeout) the URL gave.
    store_options: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """The kind of URL, for messages: "Redis", "Valkey Cluster", "Redis Sentinel"..."""
        return self.flavor.capitalize() + _KIND[self.topology]


def parse(url: str, *, timeout: float = REDIS_TIMEOUT) -> RedisURL:
    """Check a Redis or Valkey URL of any form; ConfigurationError naming what is wrong.

    Both socket timeouts default to ``timeout`` seconds. Nothing connects.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"expected a Redis URL string, got {type(url).__name__}")
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    scheme = scheme_of(url)
    form = REDIS_SCHEMES.get(scheme)
    if form is None:
        raise bad("Redis", url, f"expected one of {', '.join(s + '://' for s in REDIS_SCHEMES)}")
    flavor, tls, topology = form
    sockets = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    spec = RedisURL(scheme, flavor, tls, topology, sockets)
    try:
        _read(url, spec)
    except Invalid as exc:
        raise bad(spec.kind, url, exc) from None
    return spec


def _read(url: str, spec: RedisURL) -> None:
    """Fill ``spec`` from ``url``; Invalid naming the first thing wrong."""
    if spec.topology == "server":
        parts = split(url)
        given = options(parts, REDIS_URL_OPTIONS)
        _server(spec, parts, given)
    else:
        parts, hosts = split_hosts(url)
        given = options(parts, REDIS_URL_OPTIONS)
        example = f"{spec.scheme}://10.0.0.1:{_DEFAULT_PORT[spec.topology]},10.0.0.2"
        spec.nodes = nodes(hosts, _DEFAULT_PORT[spec.topology], example)
        path = parts.path.split("/")[1:] if parts.path else []
        if spec.topology == "cluster":
            _cluster_db("the path", "/".join(path))
        else:
            _sentinel_path(spec, path, given)
    kwargs = spec.connection
    if parts.username:
        kwargs["username"] = plain_text("the user name", unquote(parts.username))
    if parts.password:
        kwargs["password"] = unquote(parts.password)
    if "timeout" in given:  # both at once, first: either may also be given on its own
        kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = seconds("timeout", given["timeout"])
    for name, value in given.items():
        if name in _STORE_OPTIONS:
            _store_option(spec, name, value)
        elif name != "timeout":
            kwargs.update(_option(spec, name, value))
    if spec.tls and spec.topology != "server":
        kwargs["ssl"] = True  # one server's TLS is its connection class (_client)
    if spec.topology == "sentinel":
        _sentinel_kwargs(spec)


def _server(spec: RedisURL, parts: SplitResult, given: Mapping[str, str]) -> None:
    kwargs = spec.connection
    if spec.scheme == "unix":
        if parts.hostname not in (None, "", "localhost"):
            raise Invalid("a unix:// URL names a socket by its absolute path: unix:///path/to/redis.sock")
        path = unquote(parts.path)
        if not path or path == "/":
            raise Invalid("no socket path: use unix:///path/to/redis.sock")
        if "\x00" in path:
            raise Invalid("the socket path holds a NUL byte (%00)")
        kwargs["path"] = path
        return
    host = unquote(parts.hostname or "") or "localhost"
    kwargs["host"] = plain_text("the host", host)  # a NUL byte too
    if parts.port == 0:
        raise Invalid("port 0 is not a port to connect to (use 1-65535)")
    kwargs["port"] = parts.port or _DEFAULT_PORT["server"]  # named in messages too: never None
    _path_db(kwargs, unquote(parts.path)[1:], given)


def _path_db(kwargs: dict[str, Any], db: str, given: Mapping[str, str]) -> None:
    if db:
        if "db" in given:
            raise Invalid(f"the database is given twice: as the path /{db} and as ?db=")
        kwargs["db"] = whole("the path", db, "a database number, e.g. /0")


def _cluster_db(where: str, text: str) -> None:
    """A cluster's database may be named only as 0, the one it has."""
    if text and text != "0":
        what = f"/{text}" if where == "the path" else f"db={text}"
        raise Invalid(f"{where} {what}: a cluster has only database 0 (leave it out, or give 0)")


def _sentinel_path(spec: RedisURL, path: list[str], given: Mapping[str, str]) -> None:
    """``/MASTER_NAME[/DB]``: the Sentinel service, and the master's database."""
    if not path or not path[0]:
        raise Invalid(
            f"no master name: the service comes after the Sentinels, e.g. {spec.scheme}://host:26379/mymaster"
        )
    if len(path) > 2:
        raise Invalid(f"the path is /MASTER_NAME[/DB], got /{'/'.join(path)}")
    spec.service = plain_text("the master name", unquote(path[0]))
    _path_db(spec.connection, unquote(path[1]) if len(path) > 1 else "", given)


def _sentinel_kwargs(spec: RedisURL) -> None:
    """The Sentinels' connections: the same timeouts and TLS, their own user and password."""
    kwargs = spec.connection
    spec.sentinel = {k: v for k, v in kwargs.items() if k.startswith(("socket_", "ssl"))}
    for name in ("username", "password"):
        if f"sentinel_{name}" in kwargs:
            spec.sentinel[name] = kwargs.pop(f"sentinel_{name}")


def check_store_options(namespace: object, replicas: object) -> None:
    """ConfigurationError if ``namespace`` or ``replicas``, as given to a store's constructor, is wrong."""
    problem = namespace_problem(namespace) or replicas_problem(replicas)
    if problem is not None:
        raise ConfigurationError(problem)


def _store_option(spec: RedisURL, name: str, value: str) -> None:
    spec.store_options.append(name)
    if name == "namespace":
        if (problem := namespace_problem(value, "option 'namespace'")) is not None:
            raise Invalid(problem)
        spec.namespace = value
    elif name == "replicas":
        spec.replicas = whole("option 'replicas'", value, f"a whole number of replicas, 0 to {MAX_REPLICAS}")
        if (problem := replicas_problem(spec.replicas, "option 'replicas'")) is not None:
            raise Invalid(problem)
    else:
        spec.replica_timeout = seconds(name, value)


def _option(spec: RedisURL, name: str, value: str) -> dict[str, Any]:
    """The connection keyword arguments one query option sets."""
    if name.startswith("ssl_") and not spec.tls:
        flavor, _, suffix = spec.scheme.partition("+")
        tls_scheme = ("rediss" if flavor == "unix" else flavor + "s") + (f"+{suffix}" if suffix else "")
        raise Invalid(f"option {name!r} needs a {tls_scheme}:// URL")
    if name.startswith("sentinel_") and spec.topology != "sentinel":
        raise Invalid(f"option {name!r} needs a Sentinel URL ({spec.flavor}+sentinel://...)")
    if name in ("username", "password") and name in spec.connection:
        raise Invalid(f"the {name} is given twice: before the host and as ?{name}=")
    if name == "db":
        if spec.topology == "cluster":
            _cluster_db("option", value)
            return {}
        return {"db": whole("option 'db'", value, "a database number, 0 or more")}
    if name in ("socket_timeout", "socket_connect_timeout"):
        return {name: seconds(name, value)}
    if name == "health_check_interval":
        if spec.topology == "cluster":  # redis-py's cluster client would drop it without a word
            raise Invalid("option 'health_check_interval' is not for a cluster: its client takes none")
        return {name: whole(f"option {name!r}", value, "a whole number of seconds")}
    if name == "ssl_check_hostname":
        return {name: flag(name, value)}
    if name == "ssl_cert_reqs":
        if value.lower() not in ("none", "optional", "required"):
            raise Invalid(f"option 'ssl_cert_reqs' must be none, optional or required, got {value!r}")
        return {name: value.lower()}
    if name == "client_name" and (" " in value or not value.isprintable()):
        raise Invalid(f"option 'client_name' may hold no spaces or control characters, got {value!r}")
    return {name: value if name.endswith("password") else plain_text(f"option {name!r}", value)}
