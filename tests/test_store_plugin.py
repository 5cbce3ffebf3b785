"""A store written in the tests is a whole store: the proof that a new store is one module.

``tests/support/dictstore.py`` implements the two documented hooks (``_lock_machine``,
``_machine``) over dicts, plus ``scan``/``purge``; it is in ``tests/conftest.py``'s
``STORES``, so both contract suites run against it (``-k dict``). Here it runs a
``UniqueJob`` through its URL, registered for the test under ``dict://``.
"""

from __future__ import annotations

from typing import Any

import uniqjob
from tests.conftest import STORES
from tests.support.dictstore import DictBackend, DictSemaphores
from uniqjob import UniqueJob
from uniqjob.concurrency import store_for
from uniqjob.errors import ConcurrencyLimitExceeded
from uniqjob.stores.base import Backend


def test_the_dict_store_is_in_the_one_list_of_stores() -> None:
    assert "dict" in STORES
    assert isinstance(store_for(DictBackend()), DictSemaphores)


def cycle(job: type[UniqueJob], backend: Backend) -> list[Any]:
    """Enqueue inline, with a duplicate and a call over the limit tried while it runs; then run."""
    seen: list[Any] = []

    def inside() -> None:
        seen.append(sorted(backend.scan()))  # the lock is in the dict store
        seen.append(job.enqueue(1, "b"))  # the same unique key: a duplicate, dropped
        try:
            job.run(2, "a")  # another unique key, the same concurrency key: over the limit
        except ConcurrencyLimitExceeded as exc:
            seen.append(exc.limit)
        seen.append(len(list(store_for(backend).scan())))  # the slot is in its semaphores

    job.inside = inside  # type: ignore[attr-defined]
    seen.append(job.enqueue(1, "a"))  # no queue: runs inline, under both locks
    seen.append(job.run(3, "c"))  # everything was released: a fresh run takes it again
    seen.append(list(backend.scan()))
    return seen


def make_job(target: str | None) -> type[UniqueJob]:
    class Export(UniqueJob):
        unique_args = ("account",)
        concurrency_limit = 1
        concurrency_on_conflict = "raise"
        inside: Any = None  # what the first call does while it runs (set by cycle)

        @classmethod
        def concurrency_key(cls, account: int, part: str) -> str:
            return "vendor"

        def perform(self, account: int, part: str) -> str:
            if part == "a" and account == 1:
                Export.inside()
            return f"{account}{part}"

    if target is not None:
        Export.unique_backend = target
    return Export


def test_a_job_cycle_through_configure_dict_url(dict_scheme: str) -> None:
    backend = uniqjob.configure(f"{dict_scheme}://configured")
    assert isinstance(backend, DictBackend)
    job = make_job(None)
    key = job.lock_key(1, "a")
    assert cycle(job, backend) == [[key], None, 1, 1, "1a", "3c", []]


def test_a_job_cycle_through_unique_backend_dict_url(dict_scheme: str) -> None:
    uniqjob.configure("memory://")  # the default is elsewhere: the class's own URL decides
    job = make_job(f"{dict_scheme}://per-class")
    backend = job.backend()
    assert isinstance(backend, DictBackend)
    assert cycle(job, backend) == [[job.lock_key(1, "a")], None, 1, 1, "1a", "3c", []]
    assert list(uniqjob.default_backend().scan()) == []
