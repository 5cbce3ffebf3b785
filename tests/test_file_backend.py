"""The file store: records you can trust, and errors you can act on."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

import uniqjob
from uniqjob import BackendError, CorruptRecordError, UniqueJob
from uniqjob.backends.file import FileBackend
from uniqjob.locks import QueueMeta, RunClaim, local_holder


class Job(UniqueJob):
    def perform(self, n: int) -> int:
        return n


def record_path(backend: FileBackend, key: str) -> Path:
    assert backend.claim(key, "t", meta=QueueMeta()) is None
    paths = list(backend.directory.glob("*.json"))
    assert len(paths) == 1
    return paths[0]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not valid JSON"),
        (b'{"key": "k", "q": {"tok', "not valid JSON"),
        (b"[1, 2]", "not a uniqjob lock record"),
        (b'{"q": null}', "not a uniqjob lock record"),
        (b'{"key": "another", "q": null, "r": null}', "holds key 'another'"),
    ],
)
def test_unreadable_record_is_an_error_never_a_free_lock(
    file_backend: FileBackend, content: bytes, reason: str
) -> None:
    path = record_path(file_backend, "k")
    path.write_bytes(content)
    with pytest.raises(CorruptRecordError, match=reason) as info:
        file_backend.claim("k", "t2", meta=QueueMeta())
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content  # left for a person to inspect


def test_job_on_corrupt_record_does_not_run(file_backend: FileBackend) -> None:
    uniqjob.configure(file_backend)
    path = record_path(file_backend, Job.lock_key(1))
    path.write_text("garbage")
    with pytest.raises(CorruptRecordError):
        Job.run(1)


def test_records_are_plain_json_and_removed_when_free(file_backend: FileBackend) -> None:
    uniqjob.configure(file_backend)
    lock = Job.lock(1)
    assert lock.acquire()
    (path,) = file_backend.directory.glob("*.json")
    record = json.loads(path.read_text())
    assert record["key"] == lock.key and record["q"]["state"] == "queued"
    assert record["q"]["cls"] == Job.job_name()
    lock.release()
    assert list(file_backend.directory.glob("*.json")) == []
    assert list(file_backend.directory.glob(".*.tmp")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_directory(tmp_path: Path) -> None:  # pragma: no cover - CI runs as root
    backend = FileBackend(tmp_path / "locks")
    os.chmod(backend.directory, 0o500)
    with pytest.raises(BackendError, match="cannot write"):
        backend.claim("k", "t", meta=QueueMeta())


def test_directory_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BackendError, match="cannot create lock directory"):
        FileBackend(tmp_path / "file" / "locks")


def test_write_failure_keeps_old_record(file_backend: FileBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    path = record_path(file_backend, "k")
    before = path.read_bytes()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(BackendError, match="No space left on device"):
        file_backend.start("k", "t", run=RunClaim(local_holder(), 5), meta=QueueMeta())
    assert path.read_bytes() == before
    assert list(file_backend.directory.glob(".*.tmp")) == []  # no debris


def test_lock_timeout_is_a_backend_error(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "locks", timeout=0.1)
    # another process holds every stripe, as a stuck process would
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    done = ctx.Event()
    proc = ctx.Process(target=_hold_all, args=(str(tmp_path / "locks" / ".locks"), ready, done))
    proc.start()
    try:
        assert ready.wait(20)
        with pytest.raises(BackendError, match=r"timed out after 0\.1s waiting for"):
            backend.claim("k", "t", meta=QueueMeta())
    finally:
        done.set()
        proc.join(10)


def _hold_all(directory: str, ready: Any, done: Any) -> None:
    locks = [FileLock(os.path.join(directory, f"{n:02d}.lock")) for n in range(64)]
    for lock in locks:
        lock.acquire()
    ready.set()
    done.wait(20)
