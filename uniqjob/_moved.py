"""The warnings of a module that moved (once, on first import) and of a renamed name (on each use).

Each points at the line outside uniqjob that imported the module or used the name.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

__all__ = ["moved", "renamed"]


def moved(old: str, new: str) -> None:
    """Warn that module ``old`` is now ``new``; call it from ``old``'s body, as it is first imported."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: import from {new}",
        DeprecationWarning,
        stacklevel=_importer_level(),
    )


def renamed(old: str, new: str) -> None:
    """Warn that ``old`` (a name, a keyword) is now ``new``; call it where the old name is used."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: use {new}",
        DeprecationWarning,
        stacklevel=_importer_level(),
    )


def _importer_level() -> int:
    """The ``stacklevel`` of the first frame outside uniqjob, for :func:`moved` and :func:`renamed`.

    That is the line that imported the old module, by an import statement or
    through the package's lazy attributes. It is counted as :mod:`warnings`
    counts: importlib's bootstrap frames are skipped, not counted.
    """
    frame: FrameType | None = sys._getframe(1)  # moved() or renamed()
    level = 1
    while frame is not None:
        frame = _next_external(frame)
        level += 1
        if frame is not None and not _ours(frame):
            return level
    return level


def _next_external(frame: FrameType) -> FrameType | None:
    # as warnings._next_external_frame: the frames of the import system are not counted
    back = frame.f_back
    while (
        back is not None
        and "importlib" in back.f_code.co_filename
        and "_bootstrap" in back.f_code.co_filename
    ):
        back = back.f_back
    return back


def _ours(frame: FrameType) -> bool:
    """A frame of uniqjob itself, of importlib (``import_module``, called by a lazy attribute) or of abc.

    (``ABCMeta.__new__`` calls ``__init_subclass__`` of a class being defined.)
    """
    name = str(frame.f_globals.get("__name__", ""))
    return name.split(".", maxsplit=1)[0] in ("uniqjob", "importlib", "abc")
