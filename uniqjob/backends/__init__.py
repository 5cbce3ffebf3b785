"""Deprecated: the lock stores moved to :mod:`uniqjob.stores`.

``uniqjob.backends`` and ``uniqjob.backends.{base,memory,file,redis}`` stay
importable for one release: each re-exports the same objects from its new
module and warns once, on first import, naming that module.
"""

from __future__ import annotations

import warnings

from ..stores.base import Backend

__all__ = ["Backend"]


def _moved(old: str, new: str) -> None:
    """Warn that module ``old`` is now ``new``; called once, as ``old`` is first imported."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: import from {new}",
        DeprecationWarning,
        stacklevel=3,  # past this helper and the module being imported, to its importer
    )


_moved(__name__, "uniqjob.stores")
