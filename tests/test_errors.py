"""Errors keep their facts, say something useful, and survive pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import uniqjob.errors as errors_module
from uniqjob.errors import (
    BackendError,
    ConfigurationError,
    CorruptRecordError,
    JobNotUnique,
    UniqJobError,
    UniqueKeyError,
)

CASES: list[UniqJobError] = [
    JobNotUnique("app.Job:1:abc", {"state": "running", "host": "web-1", "pid": 42}),
    JobNotUnique("app.Job:1:abc"),
    UniqueKeyError('payload["user"]', "values of type object cannot be part of a lock key"),
    ConfigurationError("Job.unique_on_conflict must be one of log, discard, raise; got 'x'"),
    BackendError("Error 111 connecting to 127.0.0.1:1. Connection refused.", "redis"),
    CorruptRecordError("/var/lib/locks/ab.json", "not valid JSON"),
]


@pytest.mark.parametrize("error", CASES, ids=lambda e: type(e).__name__)
def test_pickles_with_facts_and_message(error: UniqJobError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) and str(error)
    assert vars(copy) == vars(error)
    assert isinstance(copy, UniqJobError)


def test_messages_name_the_facts() -> None:
    assert str(CASES[0]) == "job 'app.Job:1:abc' is already locked (running as pid 42 on web-1)"
    assert CASES[0].holder["host"] == "web-1"  # type: ignore[attr-defined]
    assert str(CASES[2]).startswith('payload["user"]: ')
    assert str(CASES[4]).startswith("redis: Error 111")
    assert "/var/lib/locks/ab.json" in str(CASES[5]) and isinstance(CASES[5], BackendError)


def test_familiar_bases() -> None:
    assert isinstance(CASES[2], TypeError)
    assert isinstance(CASES[3], ValueError)


def test_errors_module_imports_nothing_of_the_package() -> None:
    source = Path(errors_module.__file__).read_text(encoding="utf-8")
    assert "from ." not in source and "import uniqjob" not in source
