"""UniqueJob as a user meets it: enqueue, run, policies, hooks, settings."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, ClassVar

import pytest

import uniqjob
from tests.conftest import FakeClock
from uniqjob import ConfigurationError, JobLock, JobNotUnique, Queue, UniqueJob, UniqueKeyError
from uniqjob.keys import make_key
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend


@pytest.fixture
def use(backend: Backend) -> Backend:
    """Make ``backend`` the process-wide default for the test."""
    uniqjob.configure(backend)
    return backend


class Export(UniqueJob):
    calls: ClassVar[list[tuple[int, bool]]] = []
    inner: ClassVar[list[Any]] = []

    def perform(self, account_id: int, *, full: bool = False) -> str:
        self.calls.append((account_id, full))
        # a duplicate while this one runs is dropped, and the key shows as locked
        self.inner.append((Export.enqueue(account_id, full=full), Export.is_locked(account_id, full=full)))
        return f"exported {account_id}"


@pytest.fixture(autouse=True)
def _reset() -> None:
    Export.calls.clear()
    Export.inner.clear()


def test_enqueue_inline_runs_under_both_locks(use: Backend) -> None:
    assert Export.enqueue(42) == "exported 42"
    assert Export.calls == [(42, False)]
    assert Export.inner == [(None, True)]
    assert not Export.is_locked(42)
    assert use.read(Export.lock_key(42)).free
    assert Export.run(42, full=True) == "exported 42"  # full=True is another key, and it's free
    assert Export.calls == [(42, False), (42, True)]


def test_locks_released_when_perform_raises(use: Backend) -> None:
    class Boom(UniqueJob):
        def perform(self, n: int) -> None:
            raise ValueError(f"boom {n}")

    with pytest.raises(ValueError, match="boom 1"):
        Boom.enqueue(1)
    assert use.read(Boom.lock_key(1)).free
    with pytest.raises(ValueError, match="boom 1"):
        Boom.run(1)
    assert not Boom.is_locked(1)


def test_perform_kinds(use: Backend) -> None:
    seen: list[Any] = []

    class Static(UniqueJob):
        @staticmethod
        def perform(n: int) -> int:
            seen.append(n)
            return n * 2

    class Cls(UniqueJob):
        @classmethod
        def perform(cls, n: int) -> str:
            seen.append(cls)
            return cls.__name__

    class Instance(UniqueJob):
        def perform(self, n: int) -> UniqueJob:
            return self

    assert Static.run(2) == 4 and seen == [2]
    assert Cls.enqueue(1) == "Cls" and seen[-1] is Cls
    assert isinstance(Instance.run(1), Instance)


def test_conflict_policies(use: Backend, caplog: pytest.LogCaptureFixture) -> None:
    class Held(UniqueJob):
        unique_on_conflict: ClassVar[Any] = "log"

        def perform(self, n: int) -> str:
            return "ran"

    lock = Held.lock(1)
    assert lock.acquire()
    with caplog.at_level(logging.INFO, logger="uniqjob.job"):
        assert Held.enqueue(1) is None
        assert Held.run(1) is None
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert lock.key in caplog.records[0].getMessage() and "queued" in caplog.records[0].getMessage()

    class Quiet(Held):
        unique_on_conflict = "discard"

    caplog.clear()
    assert Quiet.lock(1).acquire()
    with caplog.at_level(logging.DEBUG, logger="uniqjob"):
        assert Quiet.enqueue(1) is None
    assert caplog.records == []

    class Loud(Held):
        unique_on_conflict = "raise"

    holder = Loud.lock(1)
    assert holder.acquire(run=True)
    with pytest.raises(JobNotUnique) as info:
        Loud.run(1)
    assert info.value.key == holder.key
    assert info.value.holder["state"] == "running" and info.value.holder["pid"] > 0
    assert holder.key in str(info.value)
    holder.release()
    assert Loud.run(1) == "ran"


def test_hooks_for_home_grown_queues(use: Backend) -> None:
    queue: list[tuple[int, ...]] = []
    ran: list[int] = []

    class Hooked(UniqueJob):
        def perform(self, n: int) -> None:
            ran.append(n)

    for n in (1, 1, 2):
        if Hooked.before_enqueue(n):
            queue.append((n,))
    assert queue == [(1,), (2,)]
    assert Hooked.is_locked(1) and Hooked.is_locked(2) and not Hooked.is_locked(3)

    # a worker takes over the queued lock; a second worker on the same key is refused
    with Hooked.around_perform(1) as lock:
        assert use.read(lock.key).queue.state == "running"  # type: ignore[union-attr]
        with pytest.raises(JobNotUnique), Hooked.around_perform(1):
            pass
        Hooked.invoke((1,), {})
        assert not Hooked.after_dequeue(1)  # running: left to its holder
    assert ran == [1] and not Hooked.is_locked(1)

    # a job removed from its queue drops its queued lock
    assert Hooked.after_dequeue(2)
    assert not Hooked.is_locked(2)
    assert not Hooked.after_dequeue(2)

    # around_perform with no queued lock creates one, and releases it at the end
    with Hooked.around_perform(3):
        assert Hooked.is_locked(3)
    assert not Hooked.is_locked(3)


def test_around_perform_releases_on_exception(use: Backend) -> None:
    class Hooked(UniqueJob):
        def perform(self, n: int) -> None:
            pass

    assert Hooked.before_enqueue(1)
    with pytest.raises(RuntimeError), Hooked.around_perform(1):
        raise RuntimeError("failed")
    assert use.read(Hooked.lock_key(1)).free


def test_before_enqueue_raises_under_raise_policy(use: Backend) -> None:
    class Strict(UniqueJob):
        unique_on_conflict = "raise"

        def perform(self, n: int) -> None:
            pass

    assert Strict.before_enqueue(1)
    with pytest.raises(JobNotUnique):
        Strict.before_enqueue(1)


class RecordingQueue(Queue):
    """A queue that keeps what it is given, for tests of the Queue contract."""

    def __init__(self, fail: bool = False) -> None:
        self.jobs: list[tuple[str, str, tuple[Any, ...]]] = []
        self.fail = fail
        self.gone: set[str] = set()
        self.ids = iter(range(1, 1000))

    def new_job_id(self) -> str:
        return f"job-{next(self.ids)}"

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.fail:
            raise ConnectionError("broker down")
        self.jobs.append((lock.key, lock.token, args))
        return lock.meta.job_id

    def job_gone(self, job_id: str) -> bool:
        return job_id in self.gone


def test_queue_integration_contract(use: Backend) -> None:
    q = RecordingQueue()
    ran: list[int] = []

    class Queued(UniqueJob):
        unique_queue = q

        def perform(self, n: int) -> None:
            ran.append(n)

    assert Queued.enqueue(1) == "job-1"
    assert Queued.enqueue(1) is None  # duplicate while queued
    assert ran == [] and len(q.jobs) == 1
    state = use.read(Queued.lock_key(1))
    assert state.queue is not None and state.queue.meta.job_id == "job-1"
    assert state.queue.meta.cls == Queued.job_name() and state.queue.meta.args == "1"

    # the worker side: rebuild the lock from what travelled with the job
    key, token, args = q.jobs[0]
    with Queued.lock_from(key, token).running():
        Queued.invoke(args, {})
    assert ran == [1] and use.read(key).free

    # a queued lock whose job the queue proves gone is reclaimed at the next enqueue
    assert Queued.enqueue(2) == "job-2"  # a duplicate takes no job id
    assert Queued.enqueue(2) is None
    q.gone.add("job-2")
    assert Queued.enqueue(2) == "job-3"


def test_failed_push_releases_the_lock(use: Backend) -> None:
    class Unpublishable(UniqueJob):
        unique_queue = RecordingQueue(fail=True)

        def perform(self, n: int) -> None:
            pass

    with pytest.raises(ConnectionError):
        Unpublishable.enqueue(1)
    assert use.read(Unpublishable.lock_key(1)).free


class _NoIds(RecordingQueue):
    def new_job_id(self) -> str:
        raise RuntimeError("no id service")


def test_a_queue_that_cannot_name_the_job_releases_the_lock(use: Backend) -> None:
    class Unnamed(UniqueJob):
        unique_queue = _NoIds()

        def perform(self, n: int) -> None:
            pass

    with pytest.raises(RuntimeError, match="no id service"):
        Unnamed.enqueue(1)
    assert use.read(Unnamed.lock_key(1)).free


def test_a_subclass_never_keeps_its_parents_key_plan() -> None:
    class Parent(UniqueJob):
        unique_backend = MemoryBackend()

        def perform(self, x: Any) -> None:
            pass

    class OwnKey(Parent):
        @classmethod
        def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
            return "always the same"

    class Starred(Parent):
        def perform(self, *xs: Any) -> None:
            pass

    assert Parent._plan.key is not None and OwnKey._plan.key is None and Starred._plan.key is None
    assert OwnKey.lock_key(1) == OwnKey.lock_key(2)  # its own unique_key, not the parent's plan
    assert Starred.lock_key(5) == make_key(Starred.job_name(), {"xs": (5,)})


def test_is_locked_ignores_orphans() -> None:
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))

    class Short(UniqueJob):
        unique_run_lease = 10
        unique_queue = RecordingQueue()

        def perform(self, n: int) -> None:
            pass

    assert Short.enqueue(1)
    lock = Short.lock_from(Short.lock_key(1), Short.unique_queue.jobs[0][1])
    lock.start()  # started, then never heard from again
    assert Short.is_locked(1)
    clock.advance(11)
    assert not Short.is_locked(1)
    assert Short.enqueue(1)  # reclaimed


def test_autoexpire_frees_queue_lock() -> None:
    clock = FakeClock()
    uniqjob.configure(MemoryBackend(clock=clock))

    class Expiring(UniqueJob):
        unique_lock_autoexpire = timedelta(minutes=1)
        unique_queue = RecordingQueue()

        def perform(self, n: int) -> None:
            pass

    assert Expiring.enqueue(1)
    clock.advance(59)
    assert Expiring.enqueue(1) is None
    clock.advance(2)
    assert Expiring.enqueue(1)

    class Inherits(Expiring):
        pass

    assert Inherits.autoexpire() == 60

    class Computed(UniqueJob):
        @classmethod
        def unique_lock_autoexpire(cls) -> float:  # type: ignore[override]
            return 5.0

        def perform(self) -> None:
            pass

    assert Computed.autoexpire() == 5.0

    class ComputedBad(UniqueJob):
        @classmethod
        def unique_lock_autoexpire(cls) -> float:  # type: ignore[override]
            return -1

        def perform(self) -> None:
            pass

    with pytest.raises(ConfigurationError, match="unique_lock_autoexpire must be positive"):
        ComputedBad.enqueue()


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"unique_lock_autoexpire": 0}, "unique_lock_autoexpire must be positive"),
        ({"unique_lock_autoexpire": -5}, "unique_lock_autoexpire must be positive"),
        ({"unique_lock_autoexpire": "1h"}, "must be a number of seconds"),
        ({"unique_lock_autoexpire": True}, "must be a number of seconds"),
        ({"unique_lock_autoexpire": float("nan")}, "must be positive"),
        ({"unique_on_conflict": "explode"}, "unique_on_conflict must be one of log, discard, raise, resch"),
        ({"unique_run_lease": 0}, "unique_run_lease must be positive"),
        ({"unique_run_lease": None}, "unique_run_lease must be set"),
        ({"unique_lock_autoexpiry": 5}, "unique_lock_autoexpiry is not a uniqjob setting"),
        ({"unique_args": "account_id"}, "must be a tuple of parameter names"),
        ({"unique_args": ("acount_id",)}, "names acount_id, not parameters of perform"),
        ({"unique_backend": 42}, "unique_backend must be a Backend or a URL"),
    ],
)
def test_bad_settings_fail_at_class_definition(attrs: dict[str, Any], message: str) -> None:
    def perform(self: Any, account_id: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match=message):
        type("Bad", (UniqueJob,), {"perform": perform, **attrs})


def test_inherited_settings_are_checked_against_the_subclass_perform() -> None:
    class Base(UniqueJob, abstract=True):
        unique_args = ("account_id",)

    with pytest.raises(ConfigurationError, match="not parameters of perform"):

        class Child(Base):
            def perform(self, user_id: int) -> None:
                pass


def test_a_job_class_without_perform_is_refused_at_definition() -> None:
    message = (
        r"tests\.test_job\.test_a_job_class_without_perform_is_refused_at_definition\.<locals>\.Export"
        r" defines no perform\(\): .* class Export\(UniqueJob, abstract=True\)"
    )
    with pytest.raises(ConfigurationError, match=message):

        class Export(UniqueJob):
            unique_on_conflict = "raise"

    with pytest.raises(ConfigurationError, match=r"\.Nightly defines no perform\(\)"):
        type("Nightly", (UniqueJob,), {"unique_lock_autoexpire": 60})

    class Abstract(UniqueJob, abstract=True):  # a base of jobs: no perform needed
        unique_on_conflict = "raise"

    with pytest.raises(ConfigurationError, match=r"\.Child defines no perform\(\)"):

        class Child(Abstract):  # abstract is the one class's, not inherited
            pass

    class Concrete(Abstract):
        def perform(self, n: int) -> int:
            return n

    assert Concrete.run(3) == 3
    with pytest.raises(ConfigurationError, match="must define perform"):
        Abstract.lock_key(1)  # an abstract class's own calls still fail, when called


def test_class_backend_overrides_default(tmp_path: Any) -> None:
    uniqjob.configure("memory://")

    class OnFiles(UniqueJob):
        unique_backend = f"file://{tmp_path}/own"

        def perform(self) -> None:
            assert OnFiles.is_locked()

    OnFiles.run()
    assert type(OnFiles.backend()).__name__ == "FileBackend"
    assert OnFiles.backend() is OnFiles.backend()  # one backend per URL


def test_bad_arguments_raise_before_anything_is_locked(use: Backend) -> None:
    with pytest.raises(UniqueKeyError, match="account_id"):
        Export.enqueue()
    assert list(use.scan()) == []


@pytest.mark.slow
def test_long_perform_keeps_its_lock(redis_backend: Backend) -> None:
    """A perform that lasts many leases is never robbed: the heartbeat renews it."""
    uniqjob.configure(redis_backend)
    release = threading.Event()
    started = threading.Event()

    class Long(UniqueJob):
        unique_run_lease = 1.0  # the shortest

        def perform(self) -> None:
            started.set()
            release.wait(5)

    t = threading.Thread(target=Long.run)
    t.start()
    try:
        assert started.wait(5)
        deadline = 2.5  # two and a half leases
        import time

        end = time.monotonic() + deadline
        while time.monotonic() < end:
            assert Long.is_locked()
            assert Long.enqueue() is None
            time.sleep(0.05)
    finally:
        release.set()
        t.join(5)
    assert not Long.is_locked()


def test_a_job_not_yet_pushed_is_never_taken_for_gone(use: Backend) -> None:
    """The job id enters the lock only once the queue holds the job (no reclaim mid-push)."""

    class Strict(RecordingQueue):
        def push(
            self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            # a second enqueue lands while this one is being pushed
            self.inner = job_cls.enqueue(*args, **kwargs)
            return super().push(job_cls, lock, args, kwargs)

        def job_gone(self, job_id: str) -> bool:
            return job_id not in {lock_id for lock_id in self.pushed}

        @property
        def pushed(self) -> list[str]:
            return [f"job-{n}" for n in range(1, len(self.jobs) + 1)]

    q = Strict()

    class Racy(UniqueJob):
        unique_queue = q

        def perform(self, n: int) -> None:
            pass

    assert Racy.enqueue(1) == "job-1"
    assert q.inner is None  # refused: no job id yet, so no proof its job is gone
    assert len(q.jobs) == 1
    assert use.read(Racy.lock_key(1)).queue.meta.job_id == "job-1"  # type: ignore[union-attr]
