"""The default of the stores' batched reads: one read per key, a damaged record's error kept in its place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import CorruptRecordError

__all__ = ["read_each"]

T = TypeVar("T")


def read_each(read: Callable[[str], T], keys: Sequence[str]) -> list[T | CorruptRecordError]:
    """``read(key)`` for each of ``keys``, in order; a :class:`CorruptRecordError` raised in its place."""
    states: list[T | CorruptRecordError] = []
    for key in keys:
        try:
            states.append(read(key))
        except CorruptRecordError as exc:
            states.append(exc)
    return states
