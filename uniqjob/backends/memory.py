"""Deprecated: moved to :mod:`uniqjob.stores.memory`; this module re-exports it for one release."""

from __future__ import annotations

from ..stores.memory import MemoryBackend
from . import _moved

__all__ = ["MemoryBackend"]

_moved(__name__, "uniqjob.stores.memory")
