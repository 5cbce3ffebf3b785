"""The Redis stores' listings, found with ``SCAN``, never ``KEYS``: held lock keys, semaphore
keys, dropped duplicates, namespaces.

Every primary of a cluster is visited, a page at a time (:func:`scan_pages`);
a name met twice (SCAN's own promise, a key that moved mid-reshard) counts
once. ``call`` runs each request as the store does, its failures BackendErrors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice
from typing import Any

from .._drops import KINDS, Tally, check_window, first_minute, tally
from .._log import get_logger
from ._client import key_of, names
from ._wire import text

__all__ = ["drops", "lock_keys", "match", "namespaces", "scan_pages", "semaphore_keys"]

#: How the store runs a request: its failures raised as BackendErrors.
Call = Callable[[Callable[[], Any]], Any]

log = get_logger(__name__)

_SCAN_PAGE = 1000
_QUEUE = ("q",)


def scan_pages(client: Any, pattern: str) -> Iterator[list[str]]:
    """The names matching ``pattern``, a SCAN page at a time, from every primary of a cluster.

    A name may come twice (SCAN's own promise, and a key that moved between
    primaries during the scan); callers drop repeats of what they yield.
    """
    targets: list[dict[str, Any]] = [{}]
    get_primaries = getattr(client, "get_primaries", None)
    if callable(get_primaries):
        primaries = get_primaries()
        if not primaries:  # redis-py 5 forgets every node when the cluster cannot be reached
            client.nodes_manager.initialize()  # finds them again, or raises what it cannot reach
            primaries = get_primaries()
        targets = [{"target_nodes": node} for node in primaries]
    for target in targets:
        cursor: Any = 0
        while True:
            cursor, page = client.scan(cursor, match=pattern, count=_SCAN_PAGE, **target)
            if isinstance(cursor, dict):  # a cluster client's reply: a cursor per node asked
                cursor = next(iter(cursor.values()), 0)
            yield [text(name) for name in page]
            if int(cursor) == 0:
                break


def match(prefix: str, part: str) -> str:
    """A SCAN pattern for every name ``_client.names`` gives ``part`` under ``prefix`` (both forms)."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}[{{~]*:{part}"


def _pages(client: Any, pattern: str, call: Call) -> Iterator[list[str]]:
    """:func:`scan_pages`, each request run by ``call``."""
    pages = scan_pages(client, pattern)
    while (page := call(partial(next, pages, None))) is not None:
        yield page


def semaphore_keys(client: Any, prefix: str, call: Call) -> Iterator[str]:
    """The semaphore keys under ``prefix`` (by their ``meta`` hash): RedisSemaphores.scan."""
    seen: set[str] = set()
    for page in _pages(client, match(prefix, "meta"), call):
        for name in page:
            key = key_of(prefix, name, "meta")
            if key is not None and key not in seen:
                seen.add(key)
                yield key


def lock_keys(client: Any, prefix: str, call: Call) -> Iterator[str]:
    """The lock keys held under ``prefix``: RedisBackend.scan.

    By name, never by content: a key whose record is damaged is listed too. Every
    primary of a cluster, a page at a time; a key is listed once, however often it is met.
    """
    seen: set[str] = set()
    for page in _pages(client, match(prefix, "[qr]"), call):
        held = [(key, name[-1]) for name in page if (key := key_of(prefix, name, name[-1:])) is not None]
        queued = {key for key, part in held if part == "q"}
        # A run lock whose queue lock autoexpired is still a held key.
        lone = [key for key, part in held if part == "r" and key not in queued and key not in seen]
        if lone:
            queues = [names(prefix, key, _QUEUE)[0] for key in lone]
            exists = call(partial(_each, client, queues, lambda pipe, name: pipe.exists(name)))
            queued.update(key for key, e in zip(lone, exists, strict=True) if not e)
        for key in queued - seen:
            seen.add(key)
            yield key


def drops(client: Any, prefix: str, call: Call, window: float) -> Tally:
    """The refused calls per kind and class under ``prefix`` over ``window`` seconds: RedisBackend.drops."""
    check_window(window)
    out: Tally = {name: {} for name in KINDS.values()}
    first: int | None = None
    seen: set[str] = set()  # a key met twice (a cluster mid-reshard) is counted once
    for found in _pages(client, match(prefix, "d"), call):
        page = [name for name in found if name not in seen]
        seen.update(page)
        if first is None:  # the window ends at the server's clock, as the counts began on it
            seconds, micros = call(client.time)
            first = first_minute(seconds + micros / 1_000_000, window)
        hgetall = partial(_each, client, page, lambda pipe, name: pipe.hgetall(name), raise_on_error=False)
        hashes = call(hgetall)
        for name, fields in zip(page, hashes, strict=True):
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
            if cls:
                buckets = {b: int(n) for b, n in counts.items() if n.isdigit()}
                tally({cls: buckets}, first, out)
    return out


def namespaces(client: Any, call: Call, limit: int) -> list[str]:
    """The namespaces holding locks, sorted, from about ``limit`` names: RedisBackend.namespaces."""
    found: set[str] = set()
    for page in islice(_pages(client, "*:[{~]*:[qr]", call), max(0, -(-limit // _SCAN_PAGE))):
        for name in page:
            head = name[: max(0, name.find("{"))]  # a namespace holds no '{': it ends before one
            namespace = head.removesuffix("~").removesuffix(":")
            if namespace and key_of(namespace + ":", name, name[-1:]) is not None:
                found.add(namespace)
    return sorted(found)


def _each(
    client: Any, found: list[str], send: Callable[[Any, str], object], *, raise_on_error: bool = True
) -> list[Any]:
    """``send(pipe, name)`` for each name in ``found``: one pipeline (a cluster's sends each command
    to its slot's node); the replies in order."""
    pipe = client.pipeline(transaction=False)
    for name in found:
        send(pipe, name)
    return list(pipe.execute(raise_on_error=raise_on_error))
