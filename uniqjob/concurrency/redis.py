"""The Redis semaphore store, now in :mod:`uniqjob.stores.redis` (importing this imports redis-py)."""

from __future__ import annotations

from ..stores.redis._semaphores import RedisSemaphores

__all__ = ["RedisSemaphores"]
