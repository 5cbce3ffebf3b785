"""A store's scan read a page of keys at a time: one batched read (``read_many``) per page.

The listings and figures read every key; each page is read in one call, so
that a store which can (Redis) reads it in one round trip, and at most one
page of states is held at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

from ..concurrency import SemaphoreState
from ..errors import BackendError, CorruptRecordError
from ..locks import LockState
from ..stores.base import Backend, SemaphoreStore

__all__ = ["PAGE", "pages", "read_scan", "read_slots"]

#: Keys read in one batch as the scan goes on.
PAGE = 500

T = TypeVar("T")


def pages(keys: Iterable[str]) -> Iterator[list[str]]:
    """``keys`` in lists of :data:`PAGE` (the last one shorter), drawn from the iterator as each is needed."""
    it = iter(keys)
    while page := list(islice(it, PAGE)):
        yield page


def read_scan(backend: Backend) -> Iterator[tuple[str, LockState | CorruptRecordError]]:
    """Each key ``backend.scan()`` yields, with its state (or the error of its damaged record)."""
    for page in pages(backend.scan()):
        yield from zip(page, _checked(backend.read_many(page), page, backend), strict=True)


def read_slots(store: SemaphoreStore, *, head: int) -> Iterator[SemaphoreState]:
    """The state of each key ``store.scan()`` yields, with its ``head`` oldest parked calls.

    A damaged record raises its :class:`CorruptRecordError`, as ``store.read`` does.
    """
    for page in pages(store.scan()):
        for state in _checked(store.read_many(page, head=head), page, store):
            if isinstance(state, CorruptRecordError):
                raise state
            yield state


def _checked(states: Sequence[T], page: Sequence[str], store: Backend | SemaphoreStore) -> Sequence[T]:
    """``states``, if the store returned one per key of ``page``; else a BackendError saying so."""
    if len(states) != len(page):
        raise BackendError(
            f"{type(store).__name__}.read_many returned {len(states)} states for {len(page)} keys",
            store.name,
        )
    return states
