"""Renamed names still work for one release, each use warning (DeprecationWarning) at the caller's line."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from uniqjob.joblock import JobLock
from uniqjob.locks import Holder, LockState, QueueMeta, QueueRecord, RunClaim
from uniqjob.stores.memory import MemoryBackend

ME = Holder("host-a", "node-a", os.getpid(), 1)
META = QueueMeta("tests.Job", "(1,)")


def _queued() -> LockState:
    return LockState("k", QueueRecord("t", "queued", 0.0, QueueMeta(), None), None, 1.0)


def test_lock_state_quiet_is_nothing_to_reclaim_with_a_warning() -> None:
    state = _queued()
    with pytest.warns(
        DeprecationWarning, match=r"LockState\.quiet is deprecated.*nothing_to_reclaim"
    ) as caught:
        assert state.quiet is state.nothing_to_reclaim is True
    assert caught[0].filename == __file__  # the caller's line, not uniqjob's


def test_lock_state_unread_takes_quiet_with_a_warning() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"unread\(quiet=\.\.\.\) is deprecated.*nothing_to_reclaim="
    ) as caught:
        state = LockState.unread("k", lambda: (None, None, 1.0), quiet=True)
    assert state.nothing_to_reclaim and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not LockState.unread(
            "k", lambda: (None, None, 1.0), nothing_to_reclaim=False
        ).nothing_to_reclaim


@pytest.mark.parametrize(
    "keywords",
    [{}, {"quiet": True, "nothing_to_reclaim": True}, {"loud": True}, {"quiet": True, "loud": True}],
    ids=["none", "both", "unknown", "old-and-unknown"],
)
def test_lock_state_unread_refuses_other_keywords(keywords: dict[str, bool]) -> None:
    with pytest.raises(TypeError, match="one keyword besides key and read: nothing_to_reclaim"):
        LockState.unread("k", lambda: (None, None, 1.0), **keywords)


def test_start_takes_queue_with_a_warning() -> None:
    backend = MemoryBackend()
    assert backend.claim("k", "t", meta=META) is None
    run = RunClaim(ME, 5.0)
    with pytest.warns(
        DeprecationWarning, match=r"Backend\.start\(queue=\.\.\.\) is deprecated.*queue_lock="
    ) as caught:
        assert backend.start("k", "t", run=run, meta=META, queue="release") is None  # type: ignore[call-arg]
    assert caught[0].filename == __file__
    assert backend.read("k").queue is None and run.fence > 0  # "release" did what it says
    with pytest.raises(TypeError, match="both queue= and queue_lock="):
        backend.start("k", "t", run=run, meta=META, queue="keep", queue_lock="keep")  # type: ignore[call-arg]


def test_a_store_written_to_the_old_start_is_warned_about_once_and_given_queue() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"OldStart\.start\(queue=\.\.\.\) is deprecated.*queue_lock="
    ) as caught:

        class OldStart(MemoryBackend):
            def start(self, key: str, token: str, *, queue: str = "run", **kw: Any) -> LockState | None:
                self.seen = queue
                return super().start(key, token, queue_lock=queue, **kw)  # type: ignore[arg-type]

    assert len(caught) == 1 and caught[0].filename == __file__
    backend = OldStart()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the callers use the new name: no warning on each call
        assert backend.start("k", "t", run=RunClaim(ME, 5.0), meta=META, queue_lock="keep") is None
    assert backend.seen == "keep" and backend.read("k").queue is None  # "keep": no queue lock made


def test_slot_and_slot_backend_are_the_lock_machine_and_its_backend_with_a_warning() -> None:
    import uniqjob.stores
    from uniqjob.stores import LockMachine, LockMachineBackend

    with pytest.warns(
        DeprecationWarning, match=r"uniqjob\.stores\.Slot is deprecated.*LockMachine"
    ) as caught:
        from uniqjob.stores import Slot
    assert Slot is LockMachine and caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=r"SlotBackend is deprecated.*LockMachineBackend") as caught:
        slot_backend = uniqjob.stores.SlotBackend
    assert caught[0].filename == __file__ and issubclass(slot_backend, LockMachineBackend)
    with pytest.raises(AttributeError, match="has no attribute 'Slots'"):
        uniqjob.stores.Slots  # noqa: B018

    class OldHook(slot_backend):  # type: ignore[misc,valid-type]  # a store written to the old names
        def __init__(self) -> None:
            self.records: dict[str, Any] = {}

        @contextmanager
        def _slot(self, key: str) -> Iterator[LockMachine]:
            locks = LockMachine(key, self.records.get(key), 1.0, lambda now_us: now_us + 1)
            yield locks
            self.records[key] = locks.record()

        def scan(self) -> Iterator[str]:
            yield from self.records

    old = OldHook()
    run = RunClaim(ME, 5.0)
    assert old.claim("k", "t", meta=META) is None and old.start("k", "t", run=run, meta=META) is None
    assert run.fence == 1_000_001 and old.read("k").run is not None  # its _slot hook did the work


def test_job_lock_slots_is_candidate_keys_with_a_warning() -> None:
    lock = JobLock(MemoryBackend(), "k", limit=3)
    with pytest.warns(DeprecationWarning, match=r"JobLock\.slots\(\) is deprecated.*candidate_key") as caught:
        assert lock.slots() == lock.candidate_keys() == ["k", "k#2", "k#3"]
    assert caught[0].filename == __file__
