"""The Redis lock store's listings: held keys, dropped duplicates, namespaces, found with ``SCAN``.

Every primary of a cluster is visited, a page at a time (``_client.scan_pages``);
a name met twice (SCAN's own promise, a key that moved mid-reshard) counts
once. ``call`` runs each request as the store does, its failures BackendErrors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from .._drops import check_window, first_minute
from ._client import key_of, match, names, scan_pages
from ._wire import text

__all__ = ["duplicates", "lock_keys", "namespaces"]

#: How the store runs a request: its failures raised as BackendErrors.
Call = Callable[[Callable[[], Any]], Any]

log = logging.getLogger(__name__)

_SCAN_PAGE = 1000
_QUEUE = ("q",)


def lock_keys(client: Any, prefix: str, call: Call) -> Iterator[str]:
    """The lock keys held under ``prefix``: RedisBackend.scan.

    By name, never by content: a key whose record is damaged is listed too. Every
    primary of a cluster, a page at a time; a key is listed once, however often it is met.
    """
    pages = call(partial(scan_pages, client, match(prefix, "[qr]"), _SCAN_PAGE))
    seen: set[str] = set()
    while True:
        page = call(partial(next, pages, None))
        if page is None:
            return
        held = [(key, name[-1]) for name in page if (key := key_of(prefix, name, name[-1:])) is not None]
        queued = {key for key, part in held if part == "q"}
        # A run lock whose queue lock autoexpired is still a held key.
        lone = [key for key, part in held if part == "r" and key not in queued and key not in seen]
        if lone:
            exists = call(partial(_exist, client, [names(prefix, key, _QUEUE)[0] for key in lone]))
            queued.update(key for key, e in zip(lone, exists, strict=True) if not e)
        for key in queued - seen:
            seen.add(key)
            yield key


def duplicates(client: Any, prefix: str, call: Call, window: float) -> dict[str, int]:
    """The dropped duplicates per class under ``prefix`` over ``window`` seconds: RedisBackend.duplicates."""
    check_window(window)
    pages = call(partial(scan_pages, client, match(prefix, "d"), _SCAN_PAGE))
    out: dict[str, int] = {}
    first: int | None = None
    seen: set[str] = set()  # a key met twice (a cluster mid-reshard) is counted once
    while True:
        page = call(partial(next, pages, None))
        if page is None:
            return out
        page = [name for name in page if name not in seen]
        seen.update(page)
        if first is None:  # the window ends at the server's clock, as the counts began on it
            seconds, micros = call(client.time)
            first = first_minute(seconds + micros / 1_000_000, window)
        for name, fields in zip(page, call(partial(_hashes, client, page)), strict=True):
            key = key_of(prefix, name, "d")
            if key is None:
                continue
            if not isinstance(fields, dict):  # another type: counts are for people, never an outage
                log.warning("skipping %s: not a hash of dropped duplicates (%s)", name, fields)
                continue
            counts = {text(f): text(v) for f, v in fields.items()}
            cls = counts.pop("c", "")
            length = counts.pop("n", "")
            if length.isdigit():
                cls = key[: int(length)]
            total = sum(int(n) for m, n in counts.items() if m.isdigit() and n.isdigit() and int(m) >= first)
            if cls and total:
                out[cls] = out.get(cls, 0) + total


def namespaces(client: Any, call: Call, limit: int) -> list[str]:
    """The namespaces holding locks, sorted, from about ``limit`` names: RedisBackend.namespaces."""
    pages = call(partial(scan_pages, client, "*:[{~]*:[qr]", _SCAN_PAGE))
    found: set[str] = set()
    for _ in range(max(0, -(-limit // _SCAN_PAGE))):
        page = call(partial(next, pages, None))
        if page is None:
            break
        for name in page:
            head = name[: max(0, name.find("{"))]  # a namespace holds no '{': it ends before one
            namespace = head.removesuffix("~").removesuffix(":")
            if namespace and key_of(namespace + ":", name, name[-1:]) is not None:
                found.add(namespace)
    return sorted(found)


def _hashes(client: Any, found: list[str]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for name in found:
        pipe.hgetall(name)
    return list(pipe.execute(raise_on_error=False))


def _exist(client: Any, found: list[str]) -> list[Any]:
    # One EXISTS per name: a cluster pipeline sends each to the node of its slot.
    pipe = client.pipeline(transaction=False)
    for name in found:
        pipe.exists(name)
    return list(pipe.execute())
