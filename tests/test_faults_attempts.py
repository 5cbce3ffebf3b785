"""Two deliveries of one job through Redis faults: each settles only its own run (issue 10).

A queue that redelivers a job (a visibility timeout, a lost ack) hands the same
token to a second worker; the store tells the two deliveries apart by attempt.
Here replies are lost for real: the tests stall their own redis-server
(``SIGSTOP``), so a call reaches the server, is applied once it resumes, and
the client has already given up on it. Whatever a delivery then does to
settle, it must never release, renew or requeue the other delivery's locks.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_server import RedisServer
from uniqjob.errors import BackendError
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

TIMEOUT = 0.5  # the client's socket timeout: each stall below outlasts it
HOLDER = local_holder()
OTHER = Holder("host-b", "node-b", 4242, 7)
META = QueueMeta("Job", "(1,)", "job-1")
LONG = 30.0  # a lease that never lapses during a test
SHORT = 0.3  # one that a test waits out


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as own:
        yield own


@pytest.fixture
def backend(server: RedisServer) -> Iterator[RedisBackend]:
    if server.pid is None:
        server.start()
    client = redis.Redis.from_url(
        server.url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, retry=Retry(NoBackoff(), 0)
    )
    client.flushall()
    b = RedisBackend(client, namespace="attempts")
    # Connected and every script loaded: a stall hits the call, not its setup.
    assert b.claim("warm", "w", meta=META, run=RunClaim(HOLDER, LONG, "w")) is None
    assert b.start("warm", "w", run=RunClaim(HOLDER, LONG, "w"), meta=META) is None
    assert b.renew("warm", "w", LONG, attempt="w")
    assert b.requeue("warm", "w", meta=META, ttl=None, attempt="w")
    b.finish("warm", "w", attempt="w")
    yield b
    b.close()


@contextmanager
def stalled(server: RedisServer) -> Iterator[None]:
    """Hold every reply of ``server`` (SIGSTOP) for the block: the calls in it time out, then apply."""
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def lost(server: RedisServer, call: Callable[[], object]) -> None:
    """Send ``call`` while the server is stalled: it fails for the client, and the server applies it later."""
    with stalled(server), pytest.raises(BackendError, match=r"[Tt]imeout"):
        call()


def deliver(b: RedisBackend, attempt: str, lease: float) -> LockState | None:
    return b.start("k", "t1", run=RunClaim(HOLDER, lease, attempt), meta=META)


def assert_held_by(b: RedisBackend, attempt_lease: float) -> None:
    """Both locks are still the live delivery's, and no other run of the key can start."""
    state = b.read("k")
    assert state.run is not None and state.run.token == "t1" and state.run.lease == attempt_lease
    assert state.queue is not None and (state.queue.token, state.queue.state) == ("t1", "running")
    assert b.claim("k", "t2", meta=META, run=RunClaim(OTHER, LONG, "n")) is not None


SETTLE: dict[str, Callable[[RedisBackend, str], object]] = {
    "finish": lambda b, attempt: b.finish("k", "t1", attempt=attempt),
    "finish-keep-queue": lambda b, attempt: b.finish("k", "t1", keep_queue=True, attempt=attempt),
    "requeue": lambda b, attempt: b.requeue("k", "t1", meta=META, ttl=None, attempt=attempt),
}


@pytest.mark.parametrize("settle", list(SETTLE))
@pytest.mark.slow
def test_a_redelivery_whose_start_was_lost_leaves_the_live_delivery(
    server: RedisServer, backend: RedisBackend, settle: str
) -> None:
    # The reviewer's failed_start: a2's START reaches the server while a1 runs
    # (so it conflicts), its reply is lost, and a2 settles its failed call.
    assert backend.claim("k", "t1", meta=META) is None
    assert deliver(backend, "a1", LONG) is None
    lost(server, lambda: deliver(backend, "a2", SHORT))
    SETTLE[settle](backend, "a2")
    assert_held_by(backend, LONG)  # a1 still holds both locks: no duplicate run can start beside it
    assert backend.renew("k", "t1", LONG, attempt="a1")
    backend.finish("k", "t1", attempt="a1")
    assert backend.read("k").free


@pytest.mark.slow
def test_a_redelivery_whose_start_was_applied_still_settles_its_own_run(
    server: RedisServer, backend: RedisBackend
) -> None:
    # a1's lease lapsed, so a2's lost START did take the key: a2's own settle
    # must still find it, or the key stays blocked until the lease lapses.
    assert backend.claim("k", "t1", meta=META) is None
    assert deliver(backend, "a1", SHORT) is None
    time.sleep(SHORT * 1.5)
    lost(server, lambda: deliver(backend, "a2", LONG))
    state = backend.read("k")
    assert state.run is not None and state.run.lease == LONG  # applied after all
    backend.finish("k", "t1", attempt="a2")
    assert backend.read("k").free


def test_a_late_finish_retried_after_a_redelivery_took_over_leaves_it(
    server: RedisServer, backend: RedisBackend
) -> None:
    # a1's finish is lost, then applied (a1's locks go); the job is redelivered
    # as a2; a retry of a1's finish must not delete a2's locks.
    assert backend.claim("k", "t1", meta=META) is None
    assert deliver(backend, "a1", LONG) is None
    lost(server, lambda: backend.finish("k", "t1", attempt="a1"))
    assert backend.claim("k", "t1", meta=META) is None  # the queue redelivers: a new wait, then a run
    assert deliver(backend, "a2", LONG) is None
    backend.finish("k", "t1", attempt="a1")
    assert_held_by(backend, LONG)


@pytest.mark.slow
def test_a_late_renewal_never_extends_the_redeliverys_lease(
    server: RedisServer, backend: RedisBackend
) -> None:
    # a1's beat stalls past its lease and a2 takes the run; a1's renewal, sent
    # then, must answer "lost" (so a1 stops) and leave a2's lease as a2 set it.
    assert backend.claim("k", "t1", meta=META) is None
    assert deliver(backend, "a1", SHORT) is None
    time.sleep(SHORT * 1.5)
    assert deliver(backend, "a2", 5.0) is None
    assert not backend.renew("k", "t1", LONG, attempt="a1")
    lost(server, lambda: backend.renew("k", "t1", LONG, attempt="a1"))
    assert_held_by(backend, 5.0)
    assert backend.renew("k", "t1", 6.0, attempt="a2")
    assert_held_by(backend, 6.0)


def test_a_run_lock_of_a_client_without_attempts_is_any_deliverys(
    server: RedisServer, backend: RedisBackend
) -> None:
    # A run lock whose hash has no attempt field (taken by a caller without one)
    # is still settled by a delivery that has one: nothing may strand it.
    assert backend.claim("k", "t1", meta=META) is None
    assert deliver(backend, "", LONG) is None
    assert not backend.client.hexists("attempts:{k}:r", "x")
    assert backend.renew("k", "t1", LONG, attempt="a1")
    backend.finish("k", "t1", attempt="a1")
    assert backend.read("k").free
