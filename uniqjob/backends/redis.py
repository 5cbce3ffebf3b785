"""Deprecated: moved to :mod:`uniqjob.stores.redis`; this module re-exports it for one release."""

from __future__ import annotations

from ..stores.redis import RedisBackend
from . import _moved

__all__ = ["RedisBackend"]

_moved(__name__, "uniqjob.stores.redis")
