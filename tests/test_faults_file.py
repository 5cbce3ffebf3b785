"""The file and memory stores through faults (issue 10): fences, records of the wrong shape, planted files.

Each test reproduces what the store did wrong before: a fence of 0, a
TypeError or a silent skip for a damaged record, a symlink followed, a
umask obeyed, a directory of another user accepted.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import STORES, FakeClock
from uniqjob.config import backend_from_url
from uniqjob.errors import BackendError, ConfigurationError, CorruptRecordError
from uniqjob.locks import Holder, QueueMeta, RunClaim
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend, FileSemaphores
from uniqjob.stores.memory import MemoryBackend, MemorySemaphores

ME = Holder("host-a", "node-a", os.getpid(), 1)
META = QueueMeta("tests.Job", "(1,)")
DAY = 86_400.0


def grant(backend: Backend, token: str, key: str = "k", attempt: str = "") -> int:
    run = RunClaim(ME, 30.0, attempt)
    assert backend.start(key, token, run=run, meta=META) is None
    return run.fence


def record_of(backend: FileBackend, key: str) -> Path:
    """Take ``key``'s queue lock for token "t" and return its record file."""
    assert backend.claim(key, "t", meta=META) is None
    path = Path(backend._stripes.of(key)[0])
    assert path.is_file()
    return path


# -- fences ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [name for name, kind in STORES.items() if kind.fake_clock])
def test_fences_follow_the_store_clock_and_never_step_back_with_it(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    clock = FakeClock()
    backend = STORES[kind].make(request, tmp_path, clock)
    first = grant(backend, "t1")
    assert first == int(clock.now * 1_000_000)  # the store clock in whole microseconds
    backend.finish("k", "t1")
    clock.advance(-3600)  # the host's clock is set back an hour
    second = grant(backend, "t2")
    assert second == first + 1  # the last fence survived the release, and wins over the clock
    backend.finish("k", "t2")
    clock.advance(2 * DAY)
    assert grant(backend, "t3") == int(clock.now * 1_000_000)


def test_a_fence_outlives_the_process_and_leaves_no_file_per_key(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = FileBackend(tmp_path / "s", clock=clock)
    fences = []
    for n in range(50):
        fences.append(grant(backend, f"t{n}", key=f"key-{n}"))
        backend.finish(f"key-{n}", f"t{n}")
    assert min(fences) >= int(clock.now * 1_000_000)
    assert list(backend.directory.glob("*.json")) == []  # no record kept for a key that holds nothing
    assert len(list(backend.directory.glob(".*.fence"))) <= 64  # bounded: one per stripe
    backend.close()
    again = FileBackend(tmp_path / "s", clock=clock)  # another process, a restart
    assert grant(again, "u", key="key-49") > fences[-1]
    state = again.read("key-49")
    assert state.run is not None and state.run.fence > fences[-1]


def test_a_fence_file_removed_under_a_running_process_is_made_again_where_others_read_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    first = FileBackend(tmp_path / "s", clock=clock)
    fence = grant(first, "t1")
    first.finish("k", "t1")
    for fence_file in first.directory.glob(".*.fence"):
        fence_file.unlink()  # a cleanup that took them for debris
    clock.advance(-60)  # and the clock steps back
    again = grant(first, "t2")
    assert again == fence + 1  # this process still knew the last fence
    first.finish("k", "t2")
    other = FileBackend(tmp_path / "s", clock=clock)  # another process
    assert grant(other, "t3") == again + 1  # it reads the fence this process kept, in the new file


def test_a_damaged_fence_file_is_written_over_and_fences_still_follow_the_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    backend = FileBackend(tmp_path / "s", clock=clock)
    first = grant(backend, "t1")
    backend.finish("k", "t1")
    (fence_file,) = backend.directory.glob(".*.fence")
    fence_file.write_bytes(b"garbage")
    clock.advance(1)
    with caplog.at_level(logging.WARNING, logger="uniqjob.stores._stripes"):
        assert grant(backend, "t2") == first + 1_000_000
    assert "not a fence" in caplog.text
    assert int(fence_file.read_bytes()) == first + 1_000_000


def test_a_symlink_at_a_fence_file_is_refused(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "s")
    stripe = backend._stripes.of("k")[1]
    target = tmp_path / "victim"
    os.symlink(target, backend.directory / f".{stripe:02d}.fence")
    with pytest.raises(BackendError, match="symbolic link"):
        grant(backend, "t1")
    assert not target.exists()
    assert backend.read("k").free  # no run lock granted without its fence kept


# -- records of the wrong shape (bug 3) -----------------------------------------------------

GOOD_QUEUE = {
    "token": "t",
    "state": "running",
    "since": 1.0,
    "cls": "",
    "args": "",
    "job_id": "",
    "expires": None,
}
GOOD_RUN = {
    "token": "t", "host": "h", "node": "n", "pid": 1, "pstart": 0, "started": 1.0, "lease": 30.0,
    "until": 4e9, "attempt": "", "f": 5,
}  # fmt: skip


def _without(lock: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in lock.items() if k != name}


MALFORMED = {
    "queue since is text": {"q": {**GOOD_QUEUE, "since": "x"}, "r": None},
    "queue lock is a string": {"q": "queued", "r": None},
    "queue lock is a list": {"q": [1], "r": None},
    "queue state unknown": {"q": {**GOOD_QUEUE, "state": "waiting"}, "r": None},
    "queue without token": {"q": _without(GOOD_QUEUE, "token"), "r": None},
    "queue expires is text": {"q": {**GOOD_QUEUE, "expires": "soon"}, "r": None},
    "queue since is NaN": {"q": {**GOOD_QUEUE, "since": float("nan")}, "r": None},
    "queue since is beyond a float": {"q": {**GOOD_QUEUE, "since": 10**400}, "r": None},
    "queue cls is a number": {"q": {**GOOD_QUEUE, "cls": 3}, "r": None},
    "run without until": {"q": GOOD_QUEUE, "r": _without(GOOD_RUN, "until")},
    "run pid is text": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "pid": "1"}},
    "run pid is a bool": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "pid": True}},
    "run pid is a float": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "pid": 1.5}},
    "run fence is text": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "f": "5"}},
    "run fence is negative": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "f": -1}},
    "run host is null": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "host": None}},
    "run lock is a number": {"q": GOOD_QUEUE, "r": 7},
    "run until is infinite": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "until": float("inf")}},
    "run attempt is a list": {"q": GOOD_QUEUE, "r": {**GOOD_RUN, "attempt": []}},
}

OPERATIONS: dict[str, Callable[[FileBackend], object]] = {
    "read": lambda b: b.read("k"),
    "claim": lambda b: b.claim("k", "t2", meta=META),
    "claim+run": lambda b: b.claim("k", "t2", meta=META, run=RunClaim(ME, 5)),
    "start": lambda b: b.start("k", "t", run=RunClaim(ME, 5), meta=META),
    "renew": lambda b: b.renew("k", "t", 5),
    "finish": lambda b: b.finish("k", "t"),
    "requeue": lambda b: b.requeue("k", "t", meta=META, ttl=None),
    "reclaim": lambda b: b.reclaim("k", "t", "t"),
}


@pytest.mark.parametrize("fields", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_record_of_the_wrong_shape_is_a_corrupt_record_never_a_crash(
    file_backend: FileBackend, fields: dict[str, Any]
) -> None:
    path = record_of(file_backend, "k")
    path.write_text(json.dumps({"key": "k", **fields}))
    for name, operation in OPERATIONS.items():
        with pytest.raises(CorruptRecordError) as info:
            operation(file_backend)
        error = info.value
        assert (error.path, error.key, error.backend) == (str(path), "k", "file"), name
    assert list(file_backend.scan()) == ["k"]  # listed, so `uniqjob locks` can show it corrupt
    assert list(file_backend.corrupt()) == []  # its key is readable: scan names it
    assert file_backend.purge("k") == [str(path)]
    assert file_backend.claim("k", "t3", meta=META) is None


def test_a_record_that_names_no_key_is_reported_and_purged_by_its_path(
    file_backend: FileBackend,
) -> None:
    path = record_of(file_backend, "k")
    path.write_bytes(b'{"key": "k", "q": {"tok')  # cut short
    assert list(file_backend.scan()) == []
    (error,) = file_backend.corrupt()  # before: skipped with a log line, and "no locks held"
    assert error.path == str(path) and error.key == "" and "not valid JSON" in error.reason
    assert f"uniqjob release --force {path}" in str(error)
    with pytest.raises(CorruptRecordError):
        file_backend.claim("k", "t2", meta=META)  # still blocked: never taken for free
    assert file_backend.purge(error.path) == [str(path)]
    assert list(file_backend.corrupt()) == []
    assert file_backend.claim("k", "t2", meta=META) is None
    assert file_backend.dequeue("k", "t2")
    assert file_backend.purge(error.path) == []  # nothing there


def test_a_record_in_another_keys_file_is_reported_by_its_path(file_backend: FileBackend) -> None:
    path = record_of(file_backend, "k")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "key": "elsewhere"}))
    assert list(file_backend.scan()) == []
    (error,) = file_backend.corrupt()
    assert error.path == str(path) and error.key == "" and "elsewhere" in error.reason
    assert file_backend.purge(error.path) == [str(path)]
    assert file_backend.read("k").free


def test_purge_is_forced_and_a_memory_store_purges_too() -> None:
    memory = MemoryBackend()
    assert memory.claim("k", "t", meta=META) is None
    assert memory.purge("k") == ["k"]
    assert memory.read("k").free and memory.purge("k") == []


# -- the concurrency store's records --------------------------------------------------------


def _semaphores(tmp_path: Path) -> tuple[FileSemaphores, Path]:
    store = FileSemaphores(tmp_path / "c")
    out = store.acquire(
        "ck", "a", limit=2, lease=60.0, running=True, holder=ME, park=None, job_class="J", args="", caller=ME
    )
    assert out.status == "taken"
    return store, Path(store._stripes.of("ck")[0])


def _queue_one(store: FileSemaphores, token: str, *, limit: int, lease: float) -> str:
    """Take a slot of "ck" for ``token``, for a queue; the outcome's status."""
    out = store.acquire(
        "ck", token, limit=limit, lease=lease, running=False, holder=None, park=None, job_class="J", args="",
        caller=ME,
    )  # fmt: skip
    return out.status


def _bad_concurrency_records() -> Iterator[tuple[str, Callable[[dict[str, Any]], None]]]:
    def slot(record: dict[str, Any]) -> dict[str, Any]:
        return record["slots"]["a"]  # type: ignore[no-any-return]

    yield "slots is a list", lambda r: r.update(slots=[])
    yield "limit is text", lambda r: r.update(limit="2")
    yield "slot without deadline", lambda r: slot(r).pop("dl")
    yield "slot deadline is text", lambda r: slot(r).update(dl="x")
    yield "slot state unknown", lambda r: slot(r).update(st="gone")
    yield "slot holder is not a holder", lambda r: slot(r).update(h="x")
    yield "slot holder pid is text", lambda r: slot(r).update(h='["h","n","1",0]')
    yield "slot redo is a bool", lambda r: slot(r).update(redo=False)
    yield "parked entry is a string", lambda r: r.update(parked=["x"])
    yield (
        "parked inline without deadline",
        lambda r: r.update(
            parked=[
                {"token": "b", "via": "inline", "h": "", "ls": 1, "since": 1, "args": "", "p": "", "dl": None}
            ]
        ),
    )
    yield "tombstone is text", lambda r: r.update(done={"a": "later"})


@pytest.mark.parametrize("damage", [pytest.param(d, id=name) for name, d in _bad_concurrency_records()])
def test_a_concurrency_record_of_the_wrong_shape_is_a_corrupt_record(
    tmp_path: Path, damage: Callable[[dict[str, Any]], None]
) -> None:
    store, path = _semaphores(tmp_path)
    record = json.loads(path.read_text())
    damage(record)
    path.write_text(json.dumps(record))
    for operation in (
        lambda: store.read("ck"),
        lambda: store.renew("ck", "a", 5.0, caller=ME),
        lambda: store.release("ck", "a", caller=ME),
        lambda: _queue_one(store, "b", limit=2, lease=1.0),
    ):
        with pytest.raises(CorruptRecordError) as info:
            operation()
        assert (info.value.path, info.value.key, info.value.backend) == (str(path), "ck", "file")
    assert list(store.scan()) == ["ck"]
    assert store.purge("ck") == [str(path)]
    assert store.read("ck").empty


def test_a_concurrency_record_that_names_no_key_is_reported_and_purged_by_path(tmp_path: Path) -> None:
    store, path = _semaphores(tmp_path)
    path.write_text("[]")
    assert list(store.scan()) == []
    (error,) = store.corrupt()
    assert error.path == str(path) and error.key == ""
    assert store.purge(error.path) == [str(path)]
    assert list(store.corrupt()) == [] and store.read("ck").empty
    memory = MemorySemaphores()
    assert memory.purge("ck") == []


# -- planted files and unsafe directories (bug 4) -------------------------------------------


def test_a_symlink_planted_at_a_stripe_lock_file_is_never_followed(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "s")
    stripe = backend._stripes.of("k")[1]
    target = tmp_path / "chosen-by-another-user"
    os.symlink(target, backend.directory / ".locks" / f"{stripe:02d}.lock")
    with pytest.raises(BackendError, match=r"\.lock: a symbolic link.*not followed; remove it"):
        backend.claim("k", "t", meta=META)
    assert not os.path.lexists(target)  # before: root's run created the file there


def test_a_symlink_planted_at_a_record_path_is_refused_and_purged_without_touching_its_target(
    file_backend: FileBackend, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"key": "k", "q": GOOD_QUEUE, "r": None}))
    before = victim.read_bytes()
    path = record_of(file_backend, "k")
    path.unlink()
    os.symlink(victim, path)
    with pytest.raises(CorruptRecordError, match="symbolic link") as info:
        file_backend.claim("k", "t2", meta=META)  # before: the victim was read as the key's lock
    assert info.value.path == str(path) and info.value.key == "k"
    assert file_backend.purge("k") == [str(path)]
    assert victim.read_bytes() == before
    assert file_backend.claim("k", "t2", meta=META) is None
    assert victim.read_bytes() == before and not path.is_symlink()


def test_a_dangling_record_symlink_creates_nothing(file_backend: FileBackend, tmp_path: Path) -> None:
    target = tmp_path / "nowhere.json"
    path = record_of(file_backend, "k")
    path.unlink()
    os.symlink(target, path)
    with pytest.raises(CorruptRecordError, match="symbolic link"):
        file_backend.claim("k", "t", meta=META)
    assert not target.exists()


def test_symlinks_planted_at_spare_paths_are_never_written_through(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "s")
    stripe = backend._stripes.of("k")[1]
    targets = [tmp_path / "a", tmp_path / "b"]
    for suffix, target in zip("ab", targets, strict=True):
        os.symlink(target, backend.directory / f".{stripe:02d}{suffix}.spare")
    with pytest.raises(BackendError, match=r"\.spare: a symbolic link.*remove it"):
        backend.claim("k", "t", meta=META)
    assert not any(os.path.lexists(target) for target in targets)
    assert backend.read("k").free


def test_a_fifo_planted_at_a_record_path_is_refused_without_blocking(file_backend: FileBackend) -> None:
    path = record_of(file_backend, "k")
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CorruptRecordError, match="not a regular file"):
        file_backend.read("k")


def test_the_concurrency_store_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    store, path = _semaphores(tmp_path)
    stripe = store._stripes.of("ck")[1]
    target = tmp_path / "tmp-target"
    os.symlink(target, store.directory / f".{stripe:02d}.tmp")
    assert store.release("ck", "a", caller=ME).status == "released"  # its inode kept as a spare
    for spare in store.directory.glob(f".{stripe:02d}?.spare"):
        spare.unlink()  # so the next record is written into a file made afresh at .NN.tmp
    assert _queue_one(store, "b", limit=1, lease=9.0) == "taken"
    assert not os.path.lexists(target)
    victim = tmp_path / "victim"
    victim.write_text(path.read_text())
    path.unlink()
    os.symlink(victim, path)
    with pytest.raises(CorruptRecordError, match="symbolic link"):
        store.read("ck")


@pytest.fixture
def umask() -> Iterator[Callable[[int], int]]:
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o277])
def test_modes_are_private_whatever_the_umask(tmp_path: Path, umask: Callable[[int], int], mask: int) -> None:
    umask(mask)
    root = tmp_path / "new" / "store"
    backend = FileBackend(root)
    # a record, a fence file and a stripe lock file
    assert backend.start("k", "t1", run=RunClaim(ME, 30.0), meta=META) is None
    backend.finish("k", "t1")  # the record's inode kept as a spare
    assert backend.claim("other", "t", meta=META) is None
    semaphores = FileSemaphores(root / "concurrency")
    semaphores.acquire(
        "ck", "a", limit=1, lease=9.0, running=False, holder=None, park=None, job_class="", args="", caller=ME
    )
    dirs = [tmp_path / "new", root, root / ".locks", root / "concurrency", root / "concurrency" / ".locks"]
    files = [p for d in dirs[1:] for p in d.iterdir() if p.is_file()]
    assert {p.suffix for p in files} >= {".json", ".spare", ".fence", ".lock"}
    assert {str(d): _mode(d) for d in dirs} == {str(d): 0o700 for d in dirs}
    assert {str(f): _mode(f) for f in files} == {str(f): 0o600 for f in files}  # before: 0o666 under umask 0


def test_lock_files_left_with_a_lax_mode_are_made_private(tmp_path: Path) -> None:
    locks = tmp_path / "s" / ".locks"
    locks.mkdir(parents=True, mode=0o700)
    tmp_path.joinpath("s").chmod(0o700)
    lax = locks / "00.lock"
    for n in range(64):
        (locks / f"{n:02d}.lock").touch(mode=0o666)
    lax.chmod(0o666)
    backend = FileBackend(tmp_path / "s")
    for n in range(200):
        assert backend.claim(f"k{n}", "t", meta=META) is None
    assert _mode(lax) == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_directory_others_may_write_without_the_sticky_bit_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ConfigurationError, match=f"{shared} is writable by other users.*chmod go-w {shared}"):
        FileBackend(shared)
    with pytest.raises(ConfigurationError, match="writable by other users"):
        FileSemaphores(shared)


def test_a_world_writable_directory_with_the_sticky_bit_is_accepted(tmp_path: Path) -> None:
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    backend = FileBackend(shared)
    assert backend.claim("k", "t", meta=META) is None
    assert _mode(shared / ".locks") == 0o700


def test_a_locks_directory_others_may_write_or_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    FileBackend(store)
    (store / ".locks").chmod(0o777)
    with pytest.raises(ConfigurationError, match=r"\.locks is writable by other users"):
        FileBackend(store)
    (store / ".locks").rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, store / ".locks")
    with pytest.raises(ConfigurationError, match=r"\.locks is not a directory"):
        FileBackend(store)


needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")


@needs_root
@pytest.mark.parametrize("which", ["store", ".locks"])
def test_a_directory_of_another_user_is_refused_even_as_root(tmp_path: Path, which: str) -> None:
    store = tmp_path / "s"
    FileBackend(store)
    os.chown(store if which == "store" else store / ".locks", 65534, -1)
    with pytest.raises(ConfigurationError, match="owned by uid 65534, not by this user"):
        FileBackend(store)
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, -1)
    with pytest.raises(ConfigurationError, match=f"{foreign} is owned by uid 65534"):
        FileBackend(foreign)
    assert list(foreign.iterdir()) == []  # refused before anything was made in it


@needs_root
def test_a_record_of_another_user_in_a_sticky_directory_is_corrupt_not_trusted(tmp_path: Path) -> None:
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)  # others may create files here, such as a record for a key not yet used
    backend = FileBackend(shared)
    path = record_of(backend, "k")
    os.chown(path, 65534, -1)
    with pytest.raises(CorruptRecordError, match="owned by uid 65534"):
        backend.read("k")


@pytest.mark.parametrize("url", ["file:///", "file:////", "file:///tmp/.."])
def test_the_root_directory_is_refused_as_a_store(url: str) -> None:
    existed = os.path.lexists("/.locks")
    with pytest.raises(ConfigurationError, match="root directory"):
        backend_from_url(url)
    assert existed or not os.path.lexists("/.locks")  # before: .locks/ went into / itself
