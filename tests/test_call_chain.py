"""From ``UniqueJob.enqueue`` to the store's primitive, a traceback reads as the call chain (docs/internals).

A store whose ``claim`` fails shows, in order, the entry point, the job layer, the job
lock's acquire and the store's own ``claim``: no driver frames, no dispatch by name.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest

from uniqjob import MemoryBackend, UniqueJob
from uniqjob.errors import BackendError
from uniqjob.stores.base import Backend


class Failing(MemoryBackend):
    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise BackendError("the store is away", self.name)


def job_on(store: Backend) -> type[UniqueJob]:
    class Report(UniqueJob):
        unique_backend = store

        def perform(self, n: int) -> int:
            return n

    return Report


def functions_of(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


def test_a_sync_enqueue_reads_down_to_the_store_call() -> None:
    job = job_on(Failing())
    with pytest.raises(BackendError) as caught:
        job.enqueue(1)
    chain = functions_of(caught.value)
    assert chain[1:] == ["enqueue", "enqueue", "run", "acquire", "claim"], chain
    files = [frame.filename.rsplit("/", 1)[-1] for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert files[1:] == ["job.py", "_job_sync.py", "_job_sync.py", "_joblock_sync.py", "test_call_chain.py"]


def test_an_async_enqueue_reads_down_to_the_store_call() -> None:
    job = job_on(Failing())
    with pytest.raises(BackendError) as caught:
        asyncio.run(job.aenqueue(1))
    chain = functions_of(caught.value)
    tail = chain[chain.index("aenqueue") :]
    assert tail == ["aenqueue", "enqueue", "run", "acquire", "claim", "claim"], tail  # face, then store
    assert not any("drive" in name for name in chain)


def test_on_redis_a_traceback_reads_down_to_the_store_method_that_sent_the_call() -> None:
    """The same on the Redis store, sync and asyncio: its failed call is raised from the store
    method of the primitive's name, then the ones that send every script call (``_done``, ``_eval``)."""
    from uniqjob.stores.redis import RedisBackend

    store = RedisBackend("redis://127.0.0.1:1", timeout=0.5)  # nothing listens on port 1
    job = job_on(store)
    with pytest.raises(BackendError) as caught:
        job.enqueue(1)
    chain = functions_of(caught.value)
    assert chain[1:] == ["enqueue", "enqueue", "run", "acquire", "claim", "_done", "_eval"], chain
    files = [frame.filename.rsplit("/", 1)[-1] for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert files[-3:] == ["_store.py", "_store.py", "_store.py"], files
    with pytest.raises(BackendError) as caught:
        asyncio.run(job.aenqueue(1))
    chain = functions_of(caught.value)
    tail = chain[chain.index("aenqueue") :]
    assert tail == ["aenqueue", "enqueue", "run", "acquire", "claim", "_done"], tail  # RedisAsync's own
    assert not any("drive" in name for name in chain)
