"""The peers timed beside uniqjob, as information: redis-py's ``Lock`` and python-redis-lock.

Each does the pieces of uniqjob's work its own way: take a free lock, be
refused a held one, take and release, take, extend and release (three
transitions, like uniqjob's full cycle).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import redis

from benchmarks.sampling import Op

__all__ = ["PEER_LABELS", "PEER_NAMES", "peer_missing", "peer_ops"]

PEER_NAMES = {"redis_py": "redis-py Lock", "redis_lock": "python-redis-lock"}
PEER_LABELS = {
    "acquire": "acquire (free)",
    "acquire_held": "acquire (held, non-blocking): rejected",
    "cycle": "acquire + release",
    "cycle3": "acquire + extend + release",
}


def peer_missing(peer: str) -> str | None:
    """Return why ``peer`` cannot be timed, or None if it can."""
    if peer == "redis_lock":
        try:
            import redis_lock  # noqa: F401
        except ImportError:
            return "python-redis-lock is not installed (pip install -e '.[bench]')"
    return None


def peer_ops(client: redis.Redis, peer: str) -> dict[str, Op]:
    """The peer's lock doing each piece of uniqjob's work; a fresh name for every call."""
    names = (f"peer:{peer}:{n}" for n in itertools.count())
    held = f"peer:{peer}:held"
    make: Callable[..., object]
    if peer == "redis_py":

        def make(name: str, expire: int = 30) -> object:
            return client.lock(name, timeout=expire)

        def extend(lock: object) -> None:
            lock.extend(30.0, replace_ttl=True)  # type: ignore[attr-defined]

    else:
        import redis_lock

        # Its failed non-blocking acquire logs a WARNING per call: keep the run quiet and fair.
        logging.getLogger("redis_lock").setLevel(logging.ERROR)

        def make(name: str, expire: int = 30) -> object:
            return redis_lock.Lock(client, name, expire=expire)

        def extend(lock: object) -> None:
            lock.extend(30)  # type: ignore[attr-defined]

    def take(lock: object) -> bool:
        return bool(lock.acquire(blocking=False))  # type: ignore[attr-defined]

    if not take(make(held, 86_400)):  # held for the whole run, however long it takes
        raise RuntimeError(f"{held} was already held: use a fresh store")

    def acquire() -> Callable[[], object]:
        lock = make(next(names))
        if not take(lock):
            raise RuntimeError("a fresh peer lock was already held")
        return lock.release  # type: ignore[attr-defined, no-any-return]

    def acquire_held() -> None:
        if take(make(held)):
            raise RuntimeError("the peer let a duplicate through")

    def cycle() -> None:
        lock = make(next(names))
        take(lock)
        lock.release()  # type: ignore[attr-defined]

    def cycle3() -> None:
        lock = make(next(names))
        take(lock)
        extend(lock)
        lock.release()  # type: ignore[attr-defined]

    return {"acquire": acquire, "acquire_held": acquire_held, "cycle": cycle, "cycle3": cycle3}
