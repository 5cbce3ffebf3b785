"""Holder identity and the orphan rule."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import replace

from uniqjob.locks import (
    Holder,
    LockState,
    Parts,
    QueueMeta,
    QueueRecord,
    RunRecord,
    holder_is_dead,
    local_holder,
    new_token,
    orphaned,
)


def test_local_holder_is_stable_and_specific() -> None:
    me = local_holder()
    assert me == local_holder()
    assert me.pid == os.getpid() and me.pstart > 0 and me.node


def test_live_process_is_alive() -> None:
    me = local_holder()
    parent = replace(me, pid=os.getppid(), pstart=0)
    assert not holder_is_dead(me)
    assert not holder_is_dead(parent)  # start time unknown: pid existence decides


def test_exited_process_is_dead() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    pid = int(child.stdout)
    assert holder_is_dead(replace(local_holder(), pid=pid, pstart=123))


def test_reused_pid_is_dead() -> None:
    me = local_holder()
    assert holder_is_dead(replace(me, pstart=me.pstart + 1))  # same pid, another process
    parent = replace(me, pid=os.getppid(), pstart=1)
    assert holder_is_dead(parent)


def test_other_hosts_and_pid_spaces_are_never_judged() -> None:
    me = local_holder()
    assert not holder_is_dead(replace(me, host="other", pid=999_999_999))
    assert not holder_is_dead(replace(me, node="other-container", pid=999_999_999))


def _state(queue_state: str | None, holder: Holder | None) -> LockState:
    queue = QueueRecord("t", queue_state, 0.0, QueueMeta(), None) if queue_state else None
    run = RunRecord("t", holder, 0.0, 30.0, 10.0) if holder else None
    return LockState("k", queue, run, 1.0)


def test_orphan_rule() -> None:
    me = local_holder()
    dead = replace(me, pstart=me.pstart + 1)
    far = replace(me, host="far", pid=1)
    assert orphaned(_state("running", None))  # lease lapsed
    assert orphaned(_state("running", dead))
    assert orphaned(_state(None, dead))
    assert not orphaned(_state("running", me))
    assert not orphaned(_state("running", far))
    assert not orphaned(_state("queued", None))  # never by this rule
    assert not orphaned(_state("queued", dead))


def test_tokens_are_unique_across_threads_and_a_fork() -> None:

    tokens: list[str] = []

    def draw() -> None:
        tokens.extend(new_token() for _ in range(2000))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(tokens)) == len(tokens) == 8000
    assert all(len(t) >= 24 and int(t, 16) >= 0 for t in tokens)  # hex, as long as before

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its tokens, right after the fork, go to the parent
        os.close(read)
        os.write(write, " ".join(new_token() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split()
    os.waitpid(pid, 0)
    mine = [new_token() for _ in range(100)]
    assert len(child) == 100
    assert not set(child) & set(mine + tokens)  # a forked child never repeats its parent's tokens


def test_nothing_to_reclaim_is_the_usual_duplicate_only() -> None:
    me = local_holder()
    assert _state("queued", None).nothing_to_reclaim
    assert not _state("queued", me).nothing_to_reclaim  # something runs
    assert not _state("running", None).nothing_to_reclaim
    assert not _state(None, me).nothing_to_reclaim
    assert not _state(None, None).nothing_to_reclaim  # free
    with_job = LockState("k", QueueRecord("t", "queued", 0.0, QueueMeta(job_id="j1"), None), None, 1.0)
    assert not with_job.nothing_to_reclaim  # its queue may prove the job gone


def test_an_unread_state_is_read_once_on_first_use() -> None:
    whole = _state("queued", None)
    reads: list[int] = []

    def read() -> Parts:
        reads.append(1)
        return whole.queue, whole.run, whole.now

    unread = LockState.unread("k", read, nothing_to_reclaim=True)
    assert unread.nothing_to_reclaim and reads == []  # deciding needs no read
    assert unread.key == "k" and reads == []
    assert unread.queue == whole.queue and reads == [1]
    assert unread.run is None and unread.now == 1.0 and unread.describe() == whole.describe()
    assert unread == whole and reads == [1]
    assert repr(unread) == repr(whole) == f"LockState(key='k', queue={whole.queue!r}, run=None, now=1.0)"


def test_an_unread_state_pickles_copies_and_matches_as_a_read_one() -> None:
    whole = _state("queued", None)
    unread = LockState.unread("k", lambda: (whole.queue, whole.run, whole.now), nothing_to_reclaim=True)
    assert pickle.loads(pickle.dumps(unread)) == whole
    assert copy.deepcopy(unread) == whole and copy.copy(unread) == whole
    match unread:
        case LockState(key, queue, None, now):
            assert (key, queue, now) == ("k", whole.queue, 1.0)
        case _:
            raise AssertionError("LockState did not match by position")
