"""Deprecated: moved to :mod:`uniqjob.stores.file`; this module re-exports it for one release."""

from __future__ import annotations

from ..stores.file import FileBackend
from . import _moved

__all__ = ["FileBackend"]

_moved(__name__, "uniqjob.stores.file")
