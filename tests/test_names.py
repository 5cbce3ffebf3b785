"""A job class's names checked at definition: clashes with the mixin, near-miss settings, misspelt hooks."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from uniqjob import UniqueJob, unique
from uniqjob._names import suggest
from uniqjob.errors import ConfigurationError


def _perform(self: Any) -> None:
    return None


def define(**body: Any) -> type[UniqueJob]:
    return type("Job", (UniqueJob,), {"perform": _perform, **body})


@pytest.mark.parametrize(
    ("attr", "meant"),
    [
        ("concurency_limit", "concurrency_limit"),
        ("concurrency_limt", "concurrency_limit"),
        ("uniq_on_conflict", "unique_on_conflict"),
        ("uniqe_strategy", "unique_strategy"),
        ("lock_autoexpire", "unique_lock_autoexpire"),
        ("lockautoexpire", "unique_lock_autoexpire"),
        ("Lock_AutoExpire", "unique_lock_autoexpire"),
        ("run_lease", "unique_run_lease"),
        ("reschedule_delay", "unique_reschedule_delay"),
        ("once_per", "unique_once_per"),
    ],
)
def test_a_near_miss_of_a_setting_is_refused_with_the_name_meant(attr: str, meant: str) -> None:
    message = rf"Job\.{attr} is not a uniqjob setting: did you mean '{meant}'"
    with pytest.raises(ConfigurationError, match=message):
        define(**{attr: 3})


def test_an_unknown_unique_name_gets_the_closest_setting_suggested() -> None:
    meant = r"is not a uniqjob setting: did you mean"
    with pytest.raises(ConfigurationError, match=rf"unique_lock_autoexpir {meant} 'unique_lock_autoexpire'"):
        define(unique_lock_autoexpir=60)
    with pytest.raises(ConfigurationError, match=rf"concurrency_durations {meant} 'concurrency_duration'"):
        define(concurrency_durations=1)


# Attributes real job classes carry (Celery task options, RQ job options, a job's own state):
# none of them is near a setting, so none is refused.
ORDINARY = [
    "name",
    "queue",
    "rate_limit",
    "time_limit",
    "soft_time_limit",
    "max_retries",
    "default_retry_delay",
    "acks_late",
    "reject_on_worker_lost",
    "ignore_result",
    "serializer",
    "track_started",
    "timeout",
    "result_ttl",
    "failure_ttl",
    "ttl",
    "job_timeout",
    "retry_delay",
    "lock_timeout",
    "lock_name",
    "lock_id",
    "on_failure",
    "on_success",
    "on_retry",
    "run_at",
    "logger",
    "log",
    "client",
    "session",
    "db_url",
    "url",
    "retries",
    "expires",
    "priority",
    "routing_key",
    "exchange",
    "description",
    "connection_timeout",
    "batch_size",
    "chunk_size",
    "limit",
    "args",
    "key",
    "strategy",
    "backend_url",
    "duration",
    "on_error",
    "once",
    "period",
    "interval",
    "schedule",
    "lease",
    "lease_seconds",
    "run_every",
    "autoretry_for",
    "retry_backoff",
    "retry_jitter",
    "throws",
    "typing",
    "concurrency",
    "conflict_policy",
    "lock_ttl",
    "lock_expire",
    "expire_after",
    "max_attempts",
    "owner",
    "region",
    "bucket",
]


@pytest.mark.parametrize("attr", ORDINARY)
def test_a_jobs_own_attributes_are_not_flagged(attr: str) -> None:
    job = define(**{attr: 3})
    assert getattr(job, attr) == 3


def test_methods_and_private_names_near_a_setting_are_the_jobs_own() -> None:
    job = define(_lock_autoexpire=5, lock_autoexpire_for=staticmethod(lambda: 1))
    assert job._lock_autoexpire == 5  # type: ignore[attr-defined]


def test_a_misspelt_perform_is_refused_at_definition() -> None:
    with pytest.raises(ConfigurationError, match=r"Job defines preform\(\) but no perform\(\): did you mean"):
        type("Job", (UniqueJob,), {"preform": _perform})
    with pytest.raises(ConfigurationError, match=r"defines perfom\(\)"):
        type("Job", (UniqueJob,), {"perfom": _perform})


def test_an_abstract_base_without_perform_stays_possible() -> None:
    class Base(UniqueJob, abstract=True):
        unique_on_conflict = "raise"

        def helper(self) -> int:
            return 1

    class Concrete(Base):
        def perform(self) -> int:
            return self.helper()

    assert Concrete.run() == 1
    with pytest.raises(ConfigurationError, match=r"Base must define perform\(\)"):
        Base.run()


def test_a_perform_inherited_from_a_base_is_not_looked_for_again() -> None:
    class Base(UniqueJob):
        def perform(self) -> int:
            return 2

    class Child(Base):
        def preform(self) -> int:  # a helper of its own: perform is Base's
            return 3

    assert Child.run() == 2


def test_a_misspelt_concurrency_key_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"defines concurency_key\(\) but no concurrency_key\(\)"):
        define(concurency_key=classmethod(lambda cls: "k"))


def test_run_as_an_instance_method_clashes_with_the_classmethod() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Job\.run replaces the mixin's own UniqueJob\.run\(\) \(a classmethod\) with an instance"
        r" method: rename it, or define it as a classmethod",
    ):
        define(run=lambda self, x: x)


def test_a_setting_written_without_its_prefix_over_a_method_names_the_setting() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Job\.backend replaces the mixin's own UniqueJob\.backend\(\) \(a classmethod\) with the str"
        r" 's3': did you mean unique_backend = 's3'\?",
    ):
        define(backend="s3")


@pytest.mark.parametrize("attr", ["lock", "enqueue", "is_locked", "semaphore", "lock_key", "autoexpire"])
def test_any_value_over_a_mixin_method_is_refused(attr: str) -> None:
    message = rf"Job\.{attr} replaces the mixin's own UniqueJob\.{attr}\(\)"
    with pytest.raises(ConfigurationError, match=message):
        define(**{attr: threading.Lock()})


def test_a_classmethod_over_a_classmethod_is_a_deliberate_override() -> None:
    job = define(job_name=classmethod(lambda cls: "custom.name"))
    assert job.lock_key().startswith("custom.name:")


def test_unique_reuses_the_suggestion_for_its_options() -> None:
    assert suggest("lock_autoexpir", ["lock_autoexpire", "on_conflict"]) == "lock_autoexpire"
    assert suggest("zzz", ["lock_autoexpire"]) is None
    message = r"no option 'lock_autoexpir' \(did you mean 'lock_autoexpire'"
    with pytest.raises(ConfigurationError, match=message):
        unique(lock_autoexpir=5)
