"""Deprecated: moved to :mod:`uniqjob.stores.base`; this module re-exports it for one release."""

from __future__ import annotations

from ..stores.base import Backend, QueueMode
from . import _moved

__all__ = ["Backend", "QueueMode"]

_moved(__name__, "uniqjob.stores.base")
