"""The Redis stores behind Sentinel: messages that name the service, errors while there is no master.

The contract suites run on the Sentinel master too (``sentinel`` in
tests/conftest.py's STORES); here: the description of a Sentinel client, a
service the Sentinels do not know, and a failover after ``kill -9`` of the
master, on a Sentinel group of this module's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from tests.conftest import sentinel_client
from tests.support.topologies import SentinelGroup
from uniqjob import BackendError
from uniqjob.concurrency import store_for
from uniqjob.locks import QueueMeta, RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend


def test_repr_and_errors_name_the_service_and_its_sentinels(sentinel_group: SentinelGroup) -> None:
    sentinels = [("127.0.0.1", s.port) for s in sentinel_group.sentinels]
    backend = RedisBackend(sentinel_client(sentinel_group), namespace="s")
    first = f"127.0.0.1:{sentinels[0][1]}"
    assert repr(backend) == (
        f"RedisBackend(Sentinel service 'mymaster' via [{', '.join(f'{h}:{p}' for h, p in sentinels)}], db=0)"
    )
    assert first in repr(backend.semaphores())
    # A service the Sentinels do not know: MasterNotFoundError, as a BackendError naming it.
    unknown = Sentinel(sentinels, socket_timeout=1).master_for("nope", socket_timeout=1)  # type: ignore[no-untyped-call, unused-ignore]
    lost = RedisBackend(unknown, namespace="s")
    for call in (lambda: lost.claim("k", "t", meta=QueueMeta()), lambda: list(lost.scan())):
        with pytest.raises(BackendError, match="Sentinel service 'nope' via") as caught:
            call()
        assert isinstance(caught.value.__cause__, MasterNotFoundError)
        assert "None:None" not in str(caught.value)


@pytest.fixture(scope="module")
def own_group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.mark.slow
def test_after_kill_9_of_the_master_calls_fail_as_backend_errors_then_reach_the_new_master(
    own_group: SentinelGroup,
) -> None:
    timeout = 1.0
    client = sentinel_client(own_group, socket_timeout=timeout, socket_connect_timeout=timeout)
    backend = RedisBackend(client, namespace="fo")
    semaphores = store_for(backend)
    run = RunClaim(local_holder(), 60)
    assert backend.claim("held", "t", meta=QueueMeta(), run=run) is None
    # Acknowledged by the replica before the kill, so the new master has it (no replica
    # acknowledgement option here: the test waits for it).
    assert client.wait(1, 900) == 1
    old = own_group.current_master()
    own_group.kill(old)
    errors: list[BaseException] = []
    started = time.monotonic()
    recovered = None
    while time.monotonic() - started < 40:
        call = time.monotonic()
        try:
            state = backend.read("held")
            list(semaphores.scan())
        except BackendError as failed:
            errors.append(failed)
            time.sleep(0.1)
        else:
            if own_group.current_master().port != old.port:
                recovered = time.monotonic() - started
                break
        finally:
            # A call is bounded by its socket timeouts and the client's retries, never hangs.
            assert time.monotonic() - call < 10 * timeout, "a call hung past its timeouts"
    assert recovered is not None, f"no new master in 40 s: {errors[-1:]}"
    assert errors, "the failover was never seen"
    for error in errors:
        assert isinstance(error.__cause__, redis.RedisError), repr(error.__cause__)
        assert "Sentinel service 'mymaster'" in str(error)
    assert state.run is not None and state.run.token == "t"  # the lock moved with the data
    new = own_group.wait_master(not_port=old.port)
    assert client.connection_pool.get_master_address()[1] == new.port  # type: ignore[attr-defined]
    backend.finish("held", "t")
    assert backend.read("held").free
