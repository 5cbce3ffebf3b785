"""The queues benchmark's round trips (machine-independent: counted by the servers, never timed).

A unique enqueue costs the queue's own round trips plus one to the lock store; a
duplicate costs one, and nothing of the queue; an RQ, arq or Celery worker's job start and finish
are one each. The RQ worker bursts (jobs/s, plain against unique) run in their quick
shape: their rows and round trips are checked, never their times.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import uniqjob
from benchmarks.queues import BURST_LIMIT, QUEUES, Servers, Trips, WorkerJob, measure, run_bursts
from benchmarks.report import Report
from tests.redis_server import RedisServer


@pytest.fixture(scope="module")
def trips(redis_server: RedisServer) -> Iterator[dict[str, dict[str, Trips]]]:
    """Each queue's paths, counted over a few calls; the queue on a redis-server of its own."""
    if redis_server.pid is None:  # a test stopped it
        redis_server.start()
    with RedisServer() as queue_server:
        yield measure(redis_server.url, queue_server.url, calls=5)


@pytest.mark.parametrize("queue", QUEUES)
def test_a_unique_enqueue_is_the_queue_s_work_plus_one_round_trip(
    trips: dict[str, dict[str, Trips]], queue: str
) -> None:
    plain, unique = trips[queue]["plain"], trips[queue]["unique"]
    assert plain.locks == 0 and plain.queue >= 1
    assert unique.queue == plain.queue  # the queue's own work, unchanged
    assert unique.locks == 1  # the claim, which records the job id: nothing attached after
    assert unique.commands["locks"]["evalsha"] == 1


@pytest.mark.parametrize("queue", QUEUES)
def test_a_duplicate_is_one_round_trip_and_leaves_the_queue_alone(
    trips: dict[str, dict[str, Trips]], queue: str
) -> None:
    duplicate = trips[queue]["duplicate"]
    assert duplicate.locks == 1
    assert duplicate.queue == 0 and not duplicate.commands["queue"]  # not even "is the job gone?"


@pytest.mark.parametrize("queue", [q for q in QUEUES if q in ("rq", "arq")])
def test_a_worker_starts_and_finishes_a_job_in_one_round_trip_each(
    trips: dict[str, dict[str, Trips]], queue: str
) -> None:
    worker = trips[queue]["worker"]
    assert worker.locks == 2
    assert worker.commands["locks"]["evalsha"] == 2  # per job
    assert worker.connections == 0  # an RQ SimpleWorker, an arq worker: one connection for all jobs


def test_a_forked_rq_work_horse_opens_one_connection_to_the_lock_store_per_job(
    trips: dict[str, dict[str, Trips]],
) -> None:
    """What is left (docs/rq.md): redis-py never lets a forked child use its parent's sockets."""
    horse = trips["rq"]["forking worker"]
    assert horse.commands["locks"]["evalsha"] == 2  # start and finish, still one round trip each
    assert horse.connections == 1  # a connection of its own, which sends nothing before the start:
    assert "hello" not in horse.commands["locks"]  # RESP2 and no CLIENT SETINFO (docs/redis.md)
    assert horse.locks <= 3  # start, finish, and the server reading the horse's socket close


@pytest.mark.parametrize("shared", [False, True])
def test_a_forked_work_horse_shares_rq_s_connection_when_the_locks_use_it(
    redis_server: RedisServer, redis_client: redis.Redis, shared: bool
) -> None:
    """Locks on RQ's Redis, through the worker's own client: one connection per horse, not two."""
    from rq import Queue, Worker

    from uniqjob.integrations.rq import RQQueue

    connection = redis.Redis.from_url(redis_server.url)
    uniqjob.configure(connection if shared else redis_server.url)
    queue = Queue("horses", connection=connection)
    WorkerJob.unique_queue = RQQueue(queue)
    worker = Worker([queue], connection=connection)
    server = Servers(redis_server.url, redis_server.url)
    server.admin = {"locks": server.admin["locks"]}  # one server: the locks and RQ's
    rq_log = logging.getLogger("rq.worker")
    level = rq_log.level
    rq_log.setLevel(logging.WARNING)
    try:
        warm = WorkerJob.enqueue(-1)
        worker.execute_job(warm, queue)
        jobs = iter([WorkerJob.enqueue(n) for n in range(3)])
        trips = server.count(3, lambda: worker.execute_job(next(jobs), queue))
    finally:
        rq_log.setLevel(level)
        server.close()
        connection.close()
        uniqjob.configure(None)
    assert queue.finished_job_registry.count == 4
    assert trips.connections == (1 if shared else 2)  # RQ's, and the locks' own
    assert trips.commands["locks"]["hello"] == 1  # RQ's client's handshake: the locks' URL client sends none


def test_rq_worker_bursts_have_their_shape_and_round_trips(redis_server: RedisServer) -> None:
    """The quick bursts (a fresh worker process each): every job run, the rates and the target reported.

    The times are not checked: a shared machine makes them what it likes.
    """
    if redis_server.pid is None:  # a test stopped it
        redis_server.start()
    report = Report()
    with RedisServer() as queue_server:
        simple, forking = run_bursts(report, redis_server.url, queue_server.url, iterations=5)
    assert (simple.worker, forking.worker) == ("SimpleWorker", "Worker")
    assert (simple.jobs, len(simple.pairs), forking.jobs, len(forking.pairs)) == (5, 2, 10, 1)
    for found in (simple, forking):
        for pair in found.pairs:
            assert set(pair) == ({"plain", "unique", "floor"} if found is simple else {"plain", "unique"})
            for burst in pair.values():
                assert burst.jobs == found.jobs and burst.seconds > 0 and burst.rate > 0
        plain, unique = found.trips("plain"), found.trips("unique")
        assert plain.locks == 0  # plain jobs never touch the lock store
        assert unique.commands["locks"]["evalsha"] == 2  # start and finish, one round trip each
        # ... and a connection's handshake (and its scripts' loading): the SimpleWorker's one is
        # shared by its jobs; a forking Worker's horse makes its own per job
        assert 2 <= unique.locks <= (2 + 10 / found.jobs if found is simple else math.inf)
        assert len(found.table()) == len(found.pairs) + (5 if found is simple else 4)
    # The floor's jobs send the unique jobs' two calls to the lock store, raw: the same scripts.
    floor, unique = simple.trips("floor"), simple.trips("unique")
    assert floor.commands["locks"] == unique.commands["locks"]
    assert simple.floor_slowdown is not None and forking.floor_slowdown is None
    assert report.figures["queues_rq_burst_floor_slowdown"] == simple.floor_slowdown
    assert found.ratio == found.median("unique") / found.median("plain")
    (target,) = [t for t in report.targets if t.id == "queues.rq.burst"]
    assert target.unit == "%" and target.limit == BURST_LIMIT
    assert target.value == simple.slowdown and target.met == (simple.slowdown <= BURST_LIMIT)
    assert report.figures["queues_rq_burst_jobs"] == 5
    assert report.figures["queues_rq_burst_ratio"] == simple.ratio
    assert report.figures["queues_rq_forking_burst_lock_trips_per_job"] >= 2



def test_a_celery_worker_starts_and_finishes_a_task_in_one_round_trip_each(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A real ``celery worker`` (one prefork child): a task's start and its finish are one script
    call each on the lock store, and nothing else is sent there (the test's own claims taken off;
    it waits by asking for the queue locks' names, which is no script call). The broker is the
    session's redis-server, as for tests/test_celery.py (the app keeps a pool of its broker's
    connections for the session); the locks are on a server of their own."""
    from tests.celery_app import app, echo
    from tests.integration_workers import REPO, URL_VAR, Workers, wait_until

    queue = redis_server
    with RedisServer() as locks:
        servers = Servers(locks.url, queue.url)
        admin = servers.admin["locks"]
        app.conf.broker_url = queue.url
        uniqjob.configure(locks.url)
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        workers = Workers(tmp_path, {URL_VAR: queue.url, "UNIQJOB_URL": locks.url, "PYTHONPATH": path})
        argv = [sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-P", "prefork"]
        argv += ["-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]

        def run(values: range) -> None:
            for value in values:
                assert echo.delay(value) is not None
            wait_until(lambda: not admin.keys("*:q"), "the tasks' locks to go", timeout=30)

        try:
            workers.start("celery", argv)
            wait_until(lambda: " ready." in workers.log("celery"), "the worker to be ready", timeout=30)
            run(range(-1, 0))  # warm: the pool child connected, the scripts loaded
            tasks = 5
            trips = servers.count(1, lambda: run(range(tasks)))
        finally:
            workers.close()
            servers.close()
            uniqjob.configure(None)
    sent = trips.commands["locks"]
    assert sent["evalsha"] == tasks + 2 * tasks, sent  # the claims, then each task's start and finish
    assert not {"hello", "script|load", "client|setinfo", "eval"} & set(sent), sent
