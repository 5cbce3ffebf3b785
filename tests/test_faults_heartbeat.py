"""The heartbeat against a real Redis that stalls, restarts, or loses replies (issue 10, bug 1).

Each test has a heartbeat of its own renewing a real run lock through
``RedisBackend.renew`` on a redis-server of this module's own, which it stops
(SIGSTOP), restarts, or reaches through a :class:`FaultProxy`. The clients'
socket timeout is short, so that a stall fails a renewal quickly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from tests.support import (
    module_redis_server,  # noqa: F401 - the `server` fixture
    sigstop,
)
from tests.support.proxy import FaultProxy
from uniqjob import heartbeat as heartbeat_module
from uniqjob.heartbeat import PRESUMED, TAKEN, Beat, Heartbeat
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

_TIMEOUT = 0.2


@pytest.fixture
def own_server(server: RedisServer) -> Iterator[RedisServer]:
    """The module's server, running again (SIGCONT, every timer done) after each test."""
    yield server
    for timer in _timers:
        timer.join(10)
    _timers.clear()
    if server.pid is not None:
        os.kill(server.pid, signal.SIGCONT)


_timers: list[threading.Timer] = []


@pytest.fixture
def hb(monkeypatch: pytest.MonkeyPatch) -> Iterator[Heartbeat]:
    # Failed renewals retried every 0.2 s rather than every second: the same logic, sooner.
    monkeypatch.setattr(heartbeat_module, "RETRY", 0.2)
    hb = Heartbeat()
    yield hb
    with hb._cond:
        for _, _, beat in hb._heap:
            beat.cancel()


_names = iter(range(10**6))


def _held(url: str, lease: float) -> tuple[RedisBackend, str, Callable[[], bool], float]:
    """A fresh run lock on ``url``: the backend, key, its renew, and the clock before the grant was sent."""
    backend = RedisBackend(url, timeout=_TIMEOUT, namespace=f"hbfault{next(_names)}")
    granted = time.monotonic()
    claim = RunClaim(local_holder(), lease, "attempt")
    assert backend.claim("nightly", "tok", meta=QueueMeta("job", "()"), run=claim) is None
    return backend, "nightly", lambda: backend.renew("nightly", "tok", lease), granted


def _stall_in_first_renewal(
    server: RedisServer, renew: Callable[[], bool], seconds: float
) -> Callable[[], bool]:
    """``renew``, except that the first call stops the server just before it talks to it, for ``seconds``."""
    calls: list[int] = []

    def stalled_renew() -> bool:
        calls.append(1)
        if len(calls) == 1:
            assert server.pid is not None
            sigstop(server.pid)
            timer = threading.Timer(seconds, os.kill, (server.pid, signal.SIGCONT))
            _timers.append(timer)
            timer.start()
        return renew()

    return stalled_renew


@pytest.mark.slow
def test_a_renewal_that_connects_during_a_stall_heals(own_server: RedisServer, hb: Heartbeat) -> None:
    # Bug 1: the heartbeat thread's first call connected during the stall; from then on
    # every beat failed ("'NoneType' object has no attribute 'poll'") and the lease lapsed.
    lease = 3.0  # renewals every second; presumed lost 2 s after the last confirmed one
    backend, key, renew, granted = _held(own_server.url, lease)
    beat = hb.start(
        _stall_in_first_renewal(own_server, renew, 0.5), lease / 3, key, lease=lease, confirmed=granted
    )
    wait_until(lambda: beat.confirmed > granted + 1.4 or beat.lost.is_set(), "a renewal after the stall", 10)
    assert not beat.lost.is_set()
    confirmed = beat.confirmed
    wait_until(lambda: beat.confirmed > confirmed, "the next renewal", 5)  # it goes on renewing
    state = backend.read(key)
    assert state.run is not None and state.run.token == "tok"
    beat.cancel()


@pytest.mark.slow
def test_a_stall_past_the_margin_is_presumed_lost_before_the_lease_can_lapse(
    own_server: RedisServer, hb: Heartbeat
) -> None:
    lease = 1.5  # presumed lost 1 s after the grant; the store keeps the lock 1.5 s at least
    backend, key, renew, granted = _held(own_server.url, lease)
    lost = threading.Event()
    beat = hb.start(
        _stall_in_first_renewal(own_server, renew, 2.0), lease / 3, key, lease=lease, confirmed=granted,
        on_lost=lost.set,
    )  # fmt: skip
    assert lost.wait(5)
    assert beat.reason == PRESUMED
    assert lease * 2 / 3 <= beat.lost_at - granted < lease
    _timers[0].join(5)  # the server answers again
    wait_until(lambda: backend.read(key).run is None, "the lease to lapse on the store", 10)
    # The renewals went on, found the lock gone (it lapsed), and stopped: lost stays set.
    wait_until(lambda: beat.reason == TAKEN, "a renewal to find the lock gone", 5)
    assert beat.lost.is_set()


@pytest.mark.slow
def test_a_renewal_whose_reply_is_lost_is_retried_and_heals(own_server: RedisServer, hb: Heartbeat) -> None:
    lease = 3.0
    with FaultProxy(("127.0.0.1", own_server.port)) as proxy:
        _, key, renew, granted = _held(proxy.url, lease)
        held: list[float] = []

        def renew_with_lost_reply() -> bool:
            if not held:  # the first renewal is applied, its reply withheld until after the timeout
                held.append(time.monotonic())
                proxy.hold_replies()
                timer = threading.Timer(0.3, proxy.resume)
                _timers.append(timer)
                timer.start()
            return renew()

        beat = hb.start(renew_with_lost_reply, lease / 3, key, lease=lease, confirmed=granted)
        wait_until(lambda: beat.confirmed > granted + 1.1 or beat.lost.is_set(), "a confirmed renewal", 10)
        assert not beat.lost.is_set()
        # The unconfirmed renewal did not count: the deadline is the retry's, not the lost one's.
        assert beat.confirmed > held[0]
        beat.cancel()


@pytest.mark.slow
def test_dropped_connections_between_beats_heal(own_server: RedisServer, hb: Heartbeat) -> None:
    lease = 1.5
    with FaultProxy(("127.0.0.1", own_server.port)) as proxy:
        _, key, renew, granted = _held(proxy.url, lease)
        beat = hb.start(renew, lease / 3, key, lease=lease, confirmed=granted)
        wait_until(lambda: beat.confirmed > granted, "the first renewal", 5)
        for _ in range(3):
            proxy.drop()
            _renewed_since(beat, beat.confirmed)
            assert not beat.lost.is_set()
        beat.cancel()


def _renewed_since(beat: Beat, confirmed: float) -> None:
    wait_until(lambda: beat.confirmed > confirmed or beat.lost.is_set(), "a renewal after the fault", 5)


@pytest.mark.slow
def test_a_restart_that_lost_the_lock_is_reported_lost_not_retried(
    own_server: RedisServer, hb: Heartbeat
) -> None:
    lease = 1.5
    _, key, renew, granted = _held(own_server.url, lease)
    beat = hb.start(renew, lease / 3, key, lease=lease, confirmed=granted)
    wait_until(lambda: beat.confirmed > granted, "the first renewal", 5)
    own_server.restart()  # no persistence: the lock is gone with the server's data
    assert beat.lost.wait(5)
    assert beat.reason == TAKEN  # the store answered again, and said the lock is not ours


def test_the_proxy_pauses_drops_and_resumes(own_server: RedisServer) -> None:
    # The tool the fault tests rely on does what it says.
    import redis

    with FaultProxy(("127.0.0.1", own_server.port)) as proxy:
        client = redis.Redis.from_url(proxy.url, socket_timeout=_TIMEOUT)
        assert client.ping() and proxy.connections == 1
        proxy.pause()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        proxy.resume()
        assert client.ping()
        proxy.delay(0.1)
        began = time.monotonic()
        assert client.ping()
        assert time.monotonic() - began >= 0.1
        proxy.delay(0)
        proxy.drop()
        assert proxy.connections == 0
        assert _ping_after_reset(client)


def _ping_after_reset(client: object) -> bool:
    import redis

    assert isinstance(client, redis.Redis)
    with contextlib.suppress(redis.ConnectionError):
        client.ping()  # the reset is seen: redis-py reports it once
    return bool(client.ping())
