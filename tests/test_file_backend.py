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
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.file import FileBackend, FileSemaphores


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


def _same_stripe(backend: FileBackend, key: str) -> str:
    stripe = backend._stripes.of(key)[1]
    return next(k for k in (f"other-{n}" for n in range(10_000)) if backend._stripes.of(k)[1] == stripe)


def test_spare_still_linked_to_a_record_is_never_written_through(file_backend: FileBackend) -> None:
    path = record_path(file_backend, "k")
    before = path.read_bytes()
    stripe = file_backend._stripes.of("k")[1]
    for spare in file_backend.directory.glob(f".{stripe:02d}?.spare"):
        spare.unlink()
    # a crash between "keep the old record under a spare's name" and the rename
    os.link(path, file_backend.directory / f".{stripe:02d}a.spare")
    assert file_backend.claim(_same_stripe(file_backend, "k"), "t2", meta=QueueMeta()) is None
    assert path.read_bytes() == before
    state = file_backend.read("k")
    assert state.queue is not None and state.queue.token == "t"


def test_transitions_reuse_spare_files_and_leave_no_debris(file_backend: FileBackend) -> None:
    uniqjob.configure(file_backend)
    for n in range(40):
        lock = Job.lock(n)
        assert lock.acquire()
        with lock.running():
            pass
    names = [p.name for p in file_backend.directory.iterdir() if p.is_file()]
    assert not [n for n in names if n.endswith((".json", ".tmp"))]
    spares = [p for p in file_backend.directory.glob(".*.spare")]
    assert spares and all(p.stat().st_nlink == 1 for p in spares)
    assert len(spares) <= 2 * len({p.name[:3] for p in spares})  # at most two per stripe


def test_the_semaphore_store_writes_through_the_same_spares(file_backend: FileBackend) -> None:
    store = file_backend.semaphores()
    assert isinstance(store, FileSemaphores)
    holder = local_holder()
    for n in range(40):
        key = f"ck-{n % 3}"
        out = store.acquire(
            key, "t", limit=1, lease=60.0, running=True, holder=holder, park=None, job_class="J", args="",
            caller=holder,
        )  # fmt: skip
        assert out.status == "taken"
        assert store.release(key, "t", caller=holder).status == "released"
    names = [p.name for p in store.directory.iterdir() if p.is_file()]
    assert not [n for n in names if n.endswith((".json", ".tmp"))]  # each record gone, no debris
    spares = list(store.directory.glob(".*.spare"))
    assert spares and all(p.stat().st_nlink == 1 for p in spares)  # every inode kept, none a record's
    assert len(spares) <= 2 * len({p.name[:3] for p in spares})
    stripe = store._stripes.of("ck-0")[1]
    for spare in store.directory.glob(f".{stripe:02d}?.spare"):
        spare.unlink()
        os.symlink(file_backend.directory / "elsewhere", spare)
    with pytest.raises(BackendError, match=r"\.spare: a symbolic link.*remove it"):
        store.acquire(
            "ck-0", "t", limit=1, lease=60.0, running=True, holder=holder, park=None, job_class="J", args="",
            caller=holder,
        )  # fmt: skip
    assert not os.path.lexists(file_backend.directory / "elsewhere")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_share_the_parents_stripe_lock(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "locks", timeout=0.2)
    assert backend.claim("k", "t", meta=QueueMeta()) is None  # the stripe's lock file is open now
    ctx = multiprocessing.get_context("fork")
    held, result = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_claim_in_child, args=(backend, held, result))
    child.start()  # forked while nobody holds the lock
    lock = backend._stripes._lock(backend._stripes.of("k")[1])
    lock.acquire()
    try:
        held.set()
        # the child must wait for the parent like any other process, not share its flock
        assert result.get(timeout=20) == "timed out"
    finally:
        lock.release()
        child.join(20)


def _claim_in_child(backend: FileBackend, held: Any, result: Any) -> None:
    held.wait(20)
    try:
        backend.claim("k", "u", meta=QueueMeta())
    except BackendError as exc:
        result.put("timed out" if "timed out" in str(exc) else str(exc))
    else:
        result.put("took the lock the parent holds")


def test_lock_files_removed_under_a_running_process_are_made_again(file_backend: FileBackend) -> None:
    import shutil

    assert file_backend.claim("k", "t", meta=QueueMeta()) is None
    shutil.rmtree(file_backend.directory / ".locks")  # a cleanup that went too far
    other = _same_stripe(file_backend, "k")
    assert file_backend.claim(other, "t", meta=QueueMeta()) is None
    stripe = file_backend._stripes.of("k")[1]
    assert (file_backend.directory / ".locks" / f"{stripe:02d}.lock").exists()
    # and the new file is the one locked: another process's FileLock on it must wait
    with file_backend._lock_machine(other), pytest.raises(TimeoutError):
        FileLock(str(file_backend.directory / ".locks" / f"{stripe:02d}.lock"), timeout=0.05).acquire()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_lock_files_are_closed_with_the_store(tmp_path: Path) -> None:
    def open_descriptors() -> int:
        # only this store's files: other tests' objects may be collected meanwhile
        where = str(tmp_path / "locks")
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(where)
            except OSError:
                continue  # closed while listing
        return count

    before = open_descriptors()
    assert before == 0
    backend = FileBackend(tmp_path / "locks")
    for n in range(20):
        assert backend.claim(f"k{n}", "t", meta=QueueMeta()) is None
    assert open_descriptors() > before  # the stripes' lock files stay open between calls
    backend.close()
    assert open_descriptors() == before
    assert backend.claim("k0", "u", meta=QueueMeta()) is not None  # usable again: it reopens them
    del backend
    import gc

    gc.collect()
    assert open_descriptors() == before  # and a store that is dropped closes them too
