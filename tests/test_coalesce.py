"""Coalescing policies as a user meets them inline: "keep_last" and "replace" (docs/strategies.md)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

import uniqjob
from uniqjob import ConfigurationError, Pending, Queue, UniqueJob
from uniqjob.joblock import JobLock
from uniqjob.stores.base import Backend


@pytest.fixture
def use(backend: Backend) -> Backend:
    uniqjob.configure(backend)
    return backend


class Sync(UniqueJob):
    """Syncs an account; a call while one runs for the account waits, keeping the latest version."""

    unique_on_conflict = "keep_last"
    unique_args = ("account",)
    runs: ClassVar[list[tuple[int, int]]] = []
    inner: ClassVar[list[Any]] = []

    def perform(self, account: int, version: int) -> int:
        self.runs.append((account, version))
        if version == 1:  # triggers while this one runs: the last one runs next
            self.inner.extend(Sync.enqueue(account, v) for v in (2, 3, 4))
        return version


class Replace(UniqueJob):
    unique_on_conflict = "replace"
    unique_args = ("account",)
    runs: ClassVar[list[int]] = []
    inner: ClassVar[list[Any]] = []

    def perform(self, account: int, version: int) -> None:
        self.runs.append(version)
        if version == 1:
            self.inner.append(Replace.enqueue(account, 2))


@pytest.fixture(autouse=True)
def _reset() -> None:
    Sync.runs.clear()
    Sync.inner.clear()
    Replace.runs.clear()
    Replace.inner.clear()


def test_keep_last_inline_runs_once_more_with_the_last_arguments(use: Backend) -> None:
    assert Sync.run(7, 1) == 1
    assert Sync.runs == [(7, 1), (7, 4)]  # 2 and 3 coalesced into 4
    assert all(isinstance(p, Pending) and p.key == Sync.lock_key(7, 0) for p in Sync.inner)
    assert use.read(Sync.lock_key(7, 0)).free
    assert use.drops()["coalesced"] == {"tests.test_coalesce.Sync": 3} and use.duplicates() == {}


def test_replace_inline_drops_a_duplicate_of_a_running_call(use: Backend) -> None:
    Replace.run(7, 1)
    assert Replace.runs == [1] and Replace.inner == [None]
    assert use.read(Replace.lock_key(7, 0)).free


def test_keep_last_refuses_arguments_the_store_cannot_keep(use: Backend) -> None:
    with pytest.raises(ConfigurationError, match=r"keep_last.*JSON"):
        Sync.run(7, object())


def test_coalescing_needs_until_executed_and_a_queue_that_can_do_it() -> None:
    with pytest.raises(ConfigurationError, match=r"'keep_last'.*until_executed"):

        class Early(UniqueJob):
            unique_on_conflict = "keep_last"
            unique_strategy = "until_executing"

            def perform(self) -> None: ...

    class NoIds(Queue):
        def push(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="names a job before it is pushed"):

        class Unnamed(UniqueJob):
            unique_on_conflict = "keep_last"
            unique_queue = NoIds()

            def perform(self) -> None: ...

    class Named(NoIds):
        suspect_after = 60.0

    with pytest.raises(ConfigurationError, match="'replace' needs a queue that can remove a job"):

        class Unremovable(UniqueJob):
            unique_on_conflict = "replace"
            unique_queue = Named()

            def perform(self) -> None: ...


class Later(Queue):
    """A queue that names its jobs and delays them (nothing is pushed anywhere)."""

    suspect_after = 60.0

    def push(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any) -> None: ...

    def push_in(self, job_cls: type[UniqueJob], lock: JobLock, args: Any, kwargs: Any, delay: float) -> None:
        pass


def test_debounce_settings_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError, match=r"unique_debounce delays its job in its queue: it has no queue"):  # noqa: E501

        class Inline(UniqueJob):
            unique_debounce = 1.0

            def perform(self) -> None: ...

    with pytest.raises(ConfigurationError, match="unique_debounce_max_wait needs unique_debounce"):

        class Unbounded(UniqueJob):
            unique_debounce_max_wait = 1.0

            def perform(self) -> None: ...

    with pytest.raises(ConfigurationError, match=r"max_wait \(1 s\) is shorter than unique_debounce \(5 s\)"):

        class Short(UniqueJob):
            unique_queue = Later()
            unique_debounce = 5.0
            unique_debounce_max_wait = 1.0

            def perform(self) -> None: ...

    with pytest.raises(ConfigurationError, match="takes unique_on_conflict 'keep_last'"):

        class Raising(UniqueJob):
            unique_queue = Later()
            unique_debounce = 5.0
            unique_on_conflict = "raise"

            def perform(self) -> None: ...


class Debounced(UniqueJob):
    unique_queue = Later()
    unique_debounce = 5.0

    def perform(self, n: int) -> None: ...


def test_a_debounced_job_is_refused_inline_and_for_one_call(use: Backend) -> None:
    with pytest.raises(ConfigurationError, match=r"unique_debounce delays its job in its queue: run\(\)"):
        Debounced.run(1)
    assert use.read(Debounced.lock_key(1)).free
    with pytest.raises(ConfigurationError, match="debounce cannot be given for one call"):
        Debounced.using(debounce=1.0)
    assert Debounced.enqueue(1) is None  # pushed, delayed (Later returns no handle)
    queued = use.read(Debounced.lock_key(1)).queue
    assert queued is not None and queued.due == pytest.approx(queued.since + 5.0, abs=1e-3)


def test_keep_last_inline_through_the_asyncio_api(use: Backend) -> None:
    assert asyncio.run(Sync.arun(8, 1)) == 1
    assert Sync.runs == [(8, 1), (8, 4)]


def test_locks_show_the_pending_call_and_the_due_time(use: Backend) -> None:
    Debounced.enqueue(2)
    row = next(r for r in uniqjob.ops.iter_rows(use) if r.key == Debounced.lock_key(2))
    assert row.due_s is not None and 4 < row.due_s <= 5 and row.pending is None
    lock = Sync.lock(9, 1)
    assert lock.acquire(run=True)
    assert isinstance(Sync.enqueue(9, 2), Pending)
    row = next(r for r in uniqjob.ops.iter_rows(use) if r.key == lock.key)
    assert row.pending == "9, 2" and row.to_json()["pending"] == "9, 2" and row.due_s is None
