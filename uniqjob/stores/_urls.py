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
from urllib.parse import SplitResult, unquote_plus, urlsplit

from ..errors import ConfigurationError

__all__ = [
    "Invalid",
    "bad",
    "flag",
    "options",
    "plain_text",
    "scheme_of",
    "seconds",
    "shown",
    "split",
    "whole",
]

_SECRET_USERINFO = re.compile(r"(?<=://)([^/?#@]*?):[^/?#@]*@")
_SECRET_OPTION = re.compile(r"(?<=[?&]password=)[^&#]*")


def scheme_of(url: str) -> str:
    """The scheme of ``url``, lowercased ("" if none), read without parsing the rest."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


class Invalid(Exception):
    """One thing wrong with a URL; :func:`bad` turns it into the ConfigurationError people see."""


def shown(url: str) -> str:
    """``url`` quoted for a message, any password in it masked."""
    return repr(_SECRET_OPTION.sub("***", _SECRET_USERINFO.sub(r"\1:***@", url)))


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
