"""APScheduler integration: a schedule started on every host runs once per tick across them.

APScheduler 3 runs each job on every host that starts its scheduler. Wrapped
in :func:`once_per_tick`, a job function runs once per tick of the store's
clock, on whichever host fires first, and never beside a run of itself::

    scheduler = BackgroundScheduler()

    @scheduler.scheduled_job("interval", minutes=5)
    @once_per_tick("5m")
    def sync_accounts() -> None: ...

The function becomes a ``@unique`` function with the ``until_expired`` strategy,
whose queue lock expires when the tick (:mod:`uniqjob._ticks`) ends: every other
call of that tick, on any host, is a dropped duplicate, and a run's run lock
refuses the ticks that follow while it lasts. docs/apscheduler.md has the rule,
misfires and coalescing.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

try:
    # Nothing of APScheduler is called here (its executors call the function), but a
    # scheduler that is not installed is better said now, with the command that adds it.
    import apscheduler  # noqa: F401
except ModuleNotFoundError as exc:  # the optional extra
    raise ModuleNotFoundError(
        f"uniqjob.integrations.apscheduler needs APScheduler ({exc.name} is missing):"
        " pip install 'uniqjob[apscheduler]'",
        name=exc.name,
    ) from exc

from .. import settings
from .._names import did_you_mean
from .._ticks import skew, tick_at
from ..errors import ConfigurationError
from ..functions import OPTIONS, _Decorator, unique
from ..job import UniqueJob
from ..stores.base import Backend

__all__ = ["CLOCK_REFRESH", "once_per_tick"]

#: Seconds between two readings of the store's clock; in between, this host's monotonic
#: clock carries the last one forward (so a call is one round trip, not two).
CLOCK_REFRESH = 60.0

# Options the wrapper sets itself: the tick is the lock's expiry.
_OURS = ("strategy", "lock_autoexpire", "once_per", "queue")


def once_per_tick(every: float | timedelta | str, /, **options: Any) -> _Decorator:
    """Decorate a job function to run once per tick of ``every`` (``30s``, ``5m``, seconds) across hosts.

    ``options`` are ``@unique``'s (``run_lease``, ``on_conflict``, ``backend``, ``args``...)
    but those the tick sets. Misspelt or bad ones are a ConfigurationError here.
    """
    period = settings.once_per(every, "once_per_tick(every)")
    if period is None or period < 1:
        raise ConfigurationError(f"once_per_tick(every): a tick must be at least 1s, got {every!r}")
    for name in options:
        if name in _OURS:
            raise ConfigurationError(f"once_per_tick sets {name} itself (the lock lasts to the tick's end)")
        if name not in OPTIONS:
            hint = did_you_mean(name, OPTIONS)
            known = ", ".join(OPTIONS)
            raise ConfigurationError(f"once_per_tick has no option {name!r} ({hint}options: {known})")
    if options.get("on_conflict") == "reschedule":
        raise ConfigurationError(
            "once_per_tick drops a tick's duplicates: on_conflict 'reschedule' would run them later"
        )
    clock = _StoreClock()

    def until_tick_end(cls: type[UniqueJob]) -> float:
        # A tick n is [n * period - skew, (n + 1) * period - skew) of the store's clock: the key is
        # free again where the next tick starts (at least a millisecond: the store's smallest expiry).
        ttl = tick_at("", period, clock.now(cls.backend(), cls.job_name())).ttl - skew(period)
        return max(ttl, 0.001)

    return unique(**options, strategy="until_expired", lock_autoexpire=classmethod(until_tick_end))


class _StoreClock:
    """The store's clock, read every :data:`CLOCK_REFRESH` seconds, carried forward on ``time.monotonic``."""

    def __init__(self) -> None:
        self._last: tuple[Backend, float, float] | None = None  # (store, its time, our monotonic then)

    def now(self, backend: Backend, key: str) -> float:
        """The store's time now (one round trip when the last reading is stale or of another store)."""
        last, now = self._last, time.monotonic()
        if last is not None and last[0] is backend and now - last[2] < CLOCK_REFRESH:
            return last[1] + (now - last[2])
        store_now = backend.read(key).now
        self._last = (backend, store_now, (now + time.monotonic()) / 2)  # read mid-way, on average
        return store_now
