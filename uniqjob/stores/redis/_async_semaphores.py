"""RedisAsyncSemaphores: the Redis semaphore store's primitives awaited through ``redis.asyncio``.

Each primitive is the very script call the sync store makes
(:meth:`RedisSemaphores.call <uniqjob.stores.redis._semaphores.RedisSemaphores.call>`:
the same script, keys and arguments) sent on the lock store's async
connections (:meth:`RedisAsync.evalsha <uniqjob.stores.redis._async.RedisAsync.evalsha>`),
and its reply read by the same reader. An error reply is explained as the sync
store explains it (a corrupt record by name), in a thread: explaining may ask
the server which structure holds the wrong type. With ``replicas`` > 0 each
primitive is the sync store's own, in a thread (its WAIT and undo rules).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..aio import in_thread
from ._async import RedisAsync
from ._semaphores import _PARTS, RedisSemaphores

__all__ = ["RedisAsyncSemaphores"]


class RedisAsyncSemaphores:
    """Awaits ``store``'s primitives on ``face``, the async face of the lock store on the same client."""

    def __init__(self, store: RedisSemaphores, face: RedisAsync) -> None:
        self.store = store
        self.face = face

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Await primitive ``name`` of the semaphore contract with these arguments; its answer."""
        store = self.store
        if store._acks is not None:  # replicas > 0: the sync store's acknowledged grants, in a thread
            return await in_thread(getattr(store, name), *args, **kwargs)
        call = store.call(name, *args, **kwargs)
        try:
            reply = await self.face.evalsha(call.script, len(_PARTS), [*store._keys(call.key), *call.argv])
        except Exception as exc:
            raise (await asyncio.to_thread(store._script_error, call.key, exc)) from exc
        return store.decoded(call, reply)
