"""How the pages write figures."""

from __future__ import annotations

__all__ = ["duration"]


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: ``4.2 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 04 h``, or ``-``."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"
