"""Deprecated: the lock stores moved to :mod:`uniqjob.stores`.

``uniqjob.backends`` and ``uniqjob.backends.{base,memory,file,redis}`` stay
importable for one release: each re-exports the same objects from its new
module and warns once, on first import, naming that module.
"""

from __future__ import annotations

from .._moved import moved
from ..stores.base import Backend

__all__ = ["Backend"]

_moved = moved  # what its submodules call

_moved(__name__, "uniqjob.stores")
