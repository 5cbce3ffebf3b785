"""How the pages write figures."""

from __future__ import annotations

__all__ = ["duration"]


#: (seconds in the larger unit, its name, seconds in the smaller, its name), largest first.
_UNITS = ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s"))


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: ``4.2 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 04 h``, or ``-``."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    for size, large, step, small in _UNITS:
        if whole >= size:
            return f"{whole // size} {large} {whole % size // step:02d} {small}"
    return f"{seconds:.1f} s"
