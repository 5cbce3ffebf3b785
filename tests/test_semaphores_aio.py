"""The typed async face of semaphore stores, and the call chain a concurrency failure shows.

Every primitive of the contract has an ``async def`` of the same name and signature on
:class:`AsyncSemaphores`; awaited on each store kind it answers as the sync call does. A
store failure met by a semaphore operation, sync or asyncio, raises through plain calls:
no frame of a step driver, so its traceback reads as the call chain.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import traceback
from pathlib import Path

import pytest

from tests.conftest import STORES, FakeClock, make_store
from uniqjob.concurrency import Semaphore, SemaphoreStore, store_for
from uniqjob.concurrency._stores import async_semaphores
from uniqjob.errors import BackendError
from uniqjob.locks import local_holder
from uniqjob.stores.memory import MemoryBackend, MemorySemaphores
from uniqjob.stores.semaphores_aio import AsyncSemaphores, DirectSemaphores

K = "jobs.Export:acct-1"

PRIMITIVES = sorted(
    name
    for name, member in vars(SemaphoreStore).items()
    if inspect.isfunction(member) and not name.startswith("_") and name != "scan"  # scan streams
)


@pytest.mark.parametrize("name", PRIMITIVES)
def test_each_primitive_has_an_async_twin_of_the_same_signature(name: str) -> None:
    twin = getattr(AsyncSemaphores, name)
    assert inspect.iscoroutinefunction(twin)
    assert inspect.signature(twin) == inspect.signature(getattr(SemaphoreStore, name))


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> SemaphoreStore:
    return store_for(make_store(request, tmp_path, clock))


def test_the_async_face_answers_as_the_sync_store(store: SemaphoreStore) -> None:
    me = local_holder()
    face = async_semaphores(store)
    assert face is async_semaphores(store)  # one per store
    assert face.sync is store

    async def main() -> None:
        taken = await face.acquire(
            K, "t1", limit=1, lease=60.0, running=True, holder=me, park=None,
            job_class="jobs.Export", args="()", caller=me,
        )  # fmt: skip
        assert taken.status == "taken"
        state = await face.read(K)
        assert [slot.token for slot in state.slots] == ["t1"]
        assert (await face.renew(K, "t1", 60.0, caller=me)).status == "ok"
        assert (await face.release(K, "t1", caller=me)).status == "released"
        [many] = await face.read_many([K])
        assert not isinstance(many, Exception) and many.empty

    asyncio.run(main())
    assert store.read(K).empty


def test_memory_is_called_in_the_event_loop_and_files_in_a_thread(tmp_path: Path) -> None:
    from uniqjob.stores.file import FileBackend

    memory = store_for(MemoryBackend())
    assert isinstance(memory, MemorySemaphores)
    assert type(async_semaphores(memory)) is DirectSemaphores
    files = store_for(FileBackend(tmp_path / "locks"))
    assert type(async_semaphores(files)) is AsyncSemaphores  # each primitive in a worker thread


class Broken(MemorySemaphores):
    """A memory store whose acquire fails as a store that is away does."""

    def acquire(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise BackendError("the store is away", self.name)


def _frames(exc: BaseException) -> list[tuple[str, str]]:
    return [(Path(f.filename).name, f.name) for f in traceback.extract_tb(exc.__traceback__)]


def test_a_store_failure_raises_through_the_call_chain_on_both_paths() -> None:
    semaphore = Semaphore(Broken(clock=time.time), K, limit=1, lease=60.0, interval=20.0)
    with pytest.raises(BackendError) as sync:
        semaphore.acquire("t1", running=True)
    frames = _frames(sync.value)
    assert frames[-2:] == [("_semaphore_sync.py", "acquire"), ("test_semaphores_aio.py", "acquire")]
    assert not any(name == "_steps.py" for name, _ in frames)

    with pytest.raises(BackendError) as asynchronous:
        asyncio.run(semaphore.aacquire("t1", running=True))
    frames = _frames(asynchronous.value)
    chain = [("_semaphore_async.py", "aacquire"), ("semaphores_aio.py", "acquire")]
    assert [frame for frame in frames if frame in chain] == chain
    assert frames[-1] == ("test_semaphores_aio.py", "acquire")
    assert not any(name == "_steps.py" for name, _ in frames)
