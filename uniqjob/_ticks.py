"""``once_per``: one run per tick of the store's clock, on any number of hosts.

A tick of a period ``D`` seconds is ``floor((now + skew) / D)``, ``now`` being
the store's clock (on Redis the server's ``TIME``, on the file and memory
stores their clock), read in the same round trip on every host. ``skew``,
:func:`skew`, lets a host whose clock runs ahead of the store's (so whose cron
fires a little early) still count into the tick it meant. The lock key names
the tick, and its lock is kept until the tick ends (autoexpire), not released
when the run finishes: every other host that fires in the same tick meets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigurationError
from .stores.base import Backend

__all__ = ["MAX_SKEW", "UNITS", "Tick", "parse_period", "skew", "tick_at", "tick_key", "tick_of"]

#: Suffixes a period may carry, in seconds; none: seconds.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

#: The most a tick is shifted (see :func:`skew`).
MAX_SKEW = 60.0


def skew(period: float) -> float:
    """Seconds a host's clock may run ahead of the store's: a tenth of the period, at most a minute."""
    return min(MAX_SKEW, period / 10)


@dataclass(frozen=True, slots=True)
class Tick:
    """The tick a call falls in: its number, the lock key that names it, and the seconds left in it."""

    number: int
    key: str
    ttl: float


def tick_key(key: str, period: float, number: int) -> str:
    """Return the lock key of ``key``'s tick ``number`` of ``period`` seconds."""
    return f"{key}:per-{period:g}s:{number}"


def tick_of(backend: Backend, key: str, period: float) -> Tick:
    """Return the tick of ``period`` seconds that the store's clock is in now, for the lock ``key``.

    The ttl ends the lock when the tick does: at ``(number + 1) * period`` on the store's clock.
    """
    return tick_at(key, period, backend.read(key).now)


def tick_at(key: str, period: float, now: float) -> Tick:
    """Return the tick of ``period`` seconds that the store's clock reading ``now`` is in (see tick_of)."""
    number = math.floor((now + skew(period)) / period)
    return Tick(number, tick_key(key, period, number), (number + 1) * period - now)


def parse_period(text: str) -> float:
    """Parse a period: ``30s``, ``5m``, ``1h``, ``1d`` or a number of seconds; ConfigurationError if bad."""
    raw = text.strip().lower()
    unit = UNITS.get(raw[-1:])
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ConfigurationError(
            f"bad period {text!r}: expected a positive number of seconds or 30s, 5m, 1h, 1d"
        )
    return value
