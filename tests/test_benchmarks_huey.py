"""The huey benchmark's round trips (machine-independent: counted by the servers, never timed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.huey_bench import measure
from benchmarks.queues import Trips
from tests.redis_server import RedisServer


@pytest.fixture(scope="module")
def trips() -> Iterator[dict[str, Trips]]:
    """Each path, counted over a few calls; the locks and Huey's storage each on a redis-server of
    their own (the session's server may still see another test's late call, a heartbeat's renewal)."""
    with RedisServer() as lock_server, RedisServer() as queue_server:
        yield measure(lock_server.url, queue_server.url, calls=5)


def test_a_unique_enqueue_is_hueys_work_plus_one_round_trip(trips: dict[str, Trips]) -> None:
    plain, unique = trips["plain"], trips["unique"]
    assert plain.locks == 0 and plain.queue == 1  # Huey's LPUSH
    assert unique.queue == plain.queue  # Huey's own work, unchanged
    assert unique.locks == 1 and unique.commands["locks"]["evalsha"] == 1  # the claim, with the task id


def test_a_duplicate_is_one_round_trip_and_leaves_huey_alone(trips: dict[str, Trips]) -> None:
    duplicate = trips["duplicate"]
    assert duplicate.locks == 1
    assert duplicate.queue == 0 and not duplicate.commands["queue"]


def test_a_consumer_starts_and_finishes_a_task_in_one_round_trip_each(trips: dict[str, Trips]) -> None:
    worker = trips["worker"]
    assert worker.locks == 2 and worker.commands["locks"]["evalsha"] == 2
