"""The sync API refuses an async answer of a queue's push, however often that answer's type was plain.

(``uniqjob._callouts`` remembers the types whose instances it found not awaitable, so a queue's job
handle is not tested in full at every enqueue: these hold that shortcut to ``inspect.isawaitable``.)
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Generator
from typing import Any

import pytest

from uniqjob import ConfigurationError, JobLock, MemoryBackend, UniqueJob
from uniqjob._callouts import awaitable
from uniqjob.queues import Queue


class Handles(Queue):
    """A sync queue whose push answers what ``make`` makes."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def push(self, job_cls: Any, lock: JobLock, args: Any, kwargs: Any) -> Any:
        return self.make()


def job_with(queue: Queue) -> Any:
    class Report(UniqueJob):
        unique_backend = MemoryBackend()
        unique_queue = queue
        unique_lock_autoexpire = 60

        def perform(self, n: int) -> None:
            """Never run: the queue keeps the job."""

    return Report


def test_a_handle_type_found_plain_is_refused_once_registered_as_awaitable() -> None:
    class Handle:
        pass

    job = job_with(Handles(Handle))
    assert isinstance(job.enqueue(1), Handle)
    assert isinstance(job.enqueue(2), Handle)  # now answered by its type
    Awaitable.register(Handle)  # (a class of the user's, made awaitable after the fact)
    with pytest.raises(ConfigurationError, match=r"Handles\.push is async \(it returned Handle\)"):
        job.enqueue(3)
    assert not job.is_locked(3) and job.is_locked(2)  # the refused call's queue lock went with it


def test_a_generator_is_answered_by_its_own_code_not_by_its_type() -> None:
    def plain() -> Generator[int, None, None]:
        yield 1

    @types.coroutine
    def old_style() -> Generator[None, None, str]:
        yield None
        return "queued"

    made = [plain(), plain(), old_style()]
    job = job_with(Handles(lambda: made.pop(0)))
    assert isinstance(job.enqueue(1), types.GeneratorType)
    assert isinstance(job.enqueue(2), types.GeneratorType)
    with pytest.raises(ConfigurationError, match=r"Handles\.push is async \(it returned generator\)"):
        job.enqueue(3)  # a generator-based coroutine, of the same type as the two before
    assert not job.is_locked(3)


def test_a_proxy_is_answered_by_the_class_it_claims() -> None:
    class Awaited:
        def __await__(self) -> Generator[None, None, None]:
            yield None

    class Proxy:
        def __init__(self, target: type) -> None:
            self.target = target

        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return self.target

    assert not awaitable(Proxy(Proxy)) and not awaitable(Proxy(Proxy))
    assert awaitable(Proxy(Awaited))  # the same type, claiming an awaitable class
    assert not awaitable(Proxy(Proxy))


def test_plain_answers_and_awaitables_are_told_apart() -> None:
    async def coroutine() -> None:
        pass

    pending = coroutine()
    try:
        for _ in range(2):
            assert not awaitable(None) and not awaitable(1) and not awaitable("queued")
            assert awaitable(pending)
    finally:
        pending.close()
