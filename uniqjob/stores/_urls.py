"""The checks every store's URL goes through, and the messages that name what is wrong.

A store's ``from_url`` splits its URL with :func:`split`, reads its query with
:func:`options` against the options it documents, and raises :class:`Invalid`
for anything malformed; :func:`bad` turns that into the
:class:`~uniqjob.errors.ConfigurationError` people see, any password masked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import SplitResult, unquote, unquote_plus, urlencode, urlsplit

from ..errors import ConfigurationError

__all__ = [
    "REDIS_SCHEMES", "Invalid", "Topology", "bad", "flag", "nodes", "options", "plain_text", "scheme_of",
    "seconds", "shown", "split", "split_hosts", "whole", "with_option",
]  # fmt: skip

Topology = Literal["server", "cluster", "sentinel"]

#: Each URL scheme of the Redis store, in the order messages list them: (flavor, TLS, topology).
#: Here, not in its package: the file store and the command need the names only.
REDIS_SCHEMES: dict[str, tuple[str, bool, Topology]] = {
    "redis": ("redis", False, "server"),
    "rediss": ("redis", True, "server"),
    "unix": ("redis", False, "server"),
    "redis+cluster": ("redis", False, "cluster"),
    "rediss+cluster": ("redis", True, "cluster"),
    "redis+sentinel": ("redis", False, "sentinel"),
    "rediss+sentinel": ("redis", True, "sentinel"),
    "valkey": ("valkey", False, "server"),
    "valkeys": ("valkey", True, "server"),
    "valkey+cluster": ("valkey", False, "cluster"),
    "valkeys+cluster": ("valkey", True, "cluster"),
    "valkey+sentinel": ("valkey", False, "sentinel"),
    "valkeys+sentinel": ("valkey", True, "sentinel"),
}

# user:pass@ after the scheme, and after a comma (credentials wrongly given per node of a list);
# compiled on first use (re keeps them): only a message shows a URL
_SECRET_USERINFO = r"(?:(?<=://)|(?<=,))([^/?#@,]*?):[^/?#@]*@"
_SECRET_OPTION = r"([?&](?:sentinel_)?password=)[^&#]*"


def scheme_of(url: str) -> str:
    """The scheme of ``url``, lowercased ("" if none), read without parsing the rest."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


class Invalid(Exception):
    """One thing wrong with a URL; :func:`bad` turns it into the ConfigurationError people see."""


def shown(url: str) -> str:
    """``url`` quoted for a message, any password in it masked."""
    return repr(re.sub(_SECRET_OPTION, r"\1***", re.sub(_SECRET_USERINFO, r"\1:***@", url)))


def bad(kind: str, url: str, reason: object) -> ConfigurationError:
    return ConfigurationError(f"bad {kind} URL {shown(url)}: {reason}")


def split(url: str) -> SplitResult:
    """Split ``url``, checking its host and port; raise Invalid naming what is malformed."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for its check: a port that is not a number 0-65535 raises
    except ValueError as exc:
        reason = str(exc)
        if reason == "Invalid IPv6 URL":
            reason = "the host is not a well-formed [IPv6] address (a bracket is missing)"
        elif reason.startswith("Port"):  # "could not be cast to integer", "out of range 0-65535"
            reason = f"the port must be a number 1-65535 ({reason})"
        raise Invalid(reason) from None
    if parts.fragment or url.endswith("#"):
        raise Invalid(
            "'#' starts a URL fragment, which means nothing here (write a '#' in a password as %23)"
        )
    return parts


def split_hosts(url: str) -> tuple[SplitResult, str]:
    """Split a URL whose netloc holds a list of hosts: the rest of it, and the list as written.

    The list (``host:port,[v6]:port,...``, after any ``user:pass@``) is cut out
    before :func:`split` reads the rest, which then names no host; read the
    list with :func:`nodes`.
    """
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    if "@" in userinfo:  # a second user:pass@ inside the list, or an '@' left unencoded
        raise Invalid(
            "the user name and password go once, before the host list (user:pass@host1:port,host2:port),"
            " for every node; an '@' inside them is written %40"
        )
    return split(f"{scheme}{sep}{userinfo}{at}{rest[end:]}"), hosts


def nodes(text: str, default_port: int, example: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a comma-separated host list; Invalid naming what is wrong.

    A host is a name, an IPv4 address or an IPv6 address in brackets, each
    with ``:port`` or without (then ``default_port``). An empty entry, and a
    node listed twice, are refused.
    """
    if not text:
        raise Invalid(f"no host: give host:port[,host:port...], e.g. {example}")
    found: list[tuple[str, int]] = []
    for number, entry in enumerate(text.split(","), 1):
        node = _node(entry, number, default_port)
        if (node[0].lower(), node[1]) in [(h.lower(), p) for h, p in found]:
            raise Invalid(f"host {number} of the list, {entry!r}, names a node already listed")
        found.append(node)
    return found


def _node(entry: str, number: int, default_port: int) -> tuple[str, int]:
    where = f"host {number} of the list"
    if not entry:
        raise Invalid(f"{where} is empty (two commas together, or one at an end)")
    if entry.startswith("["):
        address, bracket, port = entry[1:].partition("]")
        import ipaddress  # here: only a bracketed host needs it

        try:
            ipaddress.IPv6Address(unquote(address))
        except ValueError:
            bracket = ""
        if not bracket or (port and not port.startswith(":")):
            raise Invalid(f"{where}, {entry!r}, is not a well-formed [IPv6]:port")
        host, port = unquote(address), port[1:]
    elif entry.count(":") > 1:
        raise Invalid(f"{where}, {entry!r}: an IPv6 address is written in brackets, e.g. [::1]:6379")
    else:
        raw, _, port = entry.partition(":")
        host = plain_text(where, unquote(raw))
        if not host:
            raise Invalid(f"{where}, {entry!r}, names no host before its port")
    if not port:
        return host, default_port
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise Invalid(f"{where}, {entry!r}: the port must be a number 1-65535")
    return host, int(port)


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` added to its query, and everything before the query kept as written.

    (Not rebuilt by ``urlunsplit``, which writes ``unix:///path.sock`` as ``unix:/path.sock``.)
    """
    base, _, query = url.partition("?")
    return f"{base}?" + "&".join(filter(None, [query, urlencode({name: value})]))


def options(parts: SplitResult, allowed: Mapping[str, str]) -> dict[str, str]:
    """The URL's query options by name, each given once with a value, all of them in ``allowed``."""
    found: dict[str, str] = {}
    for item in parts.query.split("&") if parts.query else ():
        if not item:
            continue  # "?a=1&": an empty item says nothing
        raw_name, sep, raw_value = item.partition("=")
        name, value = unquote_plus(raw_name), unquote_plus(raw_value)
        if name not in allowed:
            supported = ", ".join(allowed) if allowed else "none"
            raise Invalid(f"unknown option {name!r} (supported: {supported})")
        if not sep or not value:
            raise Invalid(f"option {name!r} needs a value ({name}=...)")
        if name in found:
            raise Invalid(f"option {name!r} is given twice")
        found[name] = value
    return found


def seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise Invalid(f"option {name!r} must be a number of seconds > 0, got {text!r}")
    return value


def whole(name: str, text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise Invalid(f"{name} must be {what}, got {text!r}")
    return int(text)


def flag(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "yes", "no", "1", "0"):
        raise Invalid(f"option {name!r} must be true or false, got {text!r}")
    return lowered in ("true", "yes", "1")


def plain_text(name: str, text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise Invalid(f"{name} holds a control character")
    return text
