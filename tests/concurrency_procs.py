"""Jobs, a queue and process entry points for the concurrency race tests (importable by spawned children).

The queue is a Redis list on the test server, with at-least-once delivery: a
worker moves a message to its own ``processing:<pid>`` list and removes it when
done, and the test puts a killed worker's message back. Every perform writes
``S`` and ``E`` lines (job, key, pid, monotonic time) to an events file, one
``write`` each, so the test can rebuild who ran what and when.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import redis

import uniqjob
from uniqjob import Queue, UniqueJob
from uniqjob.joblock import JobLock

EVENTS = "UNIQJOB_TEST_EVENTS"
QUEUE_URL = "UNIQJOB_TEST_QUEUE"
DIE_ON_PUSH = "UNIQJOB_TEST_DIE_ON_PUSH"  # "before" / "after": the promoter dies around its push


def event(kind: str, job: object, key: object) -> None:
    """Append one event line; a single write, so lines from many processes never interleave."""
    line = f"{kind} {job} {key} {os.getpid()} {time.monotonic():.6f}\n".encode()
    fd = os.open(os.environ[EVENTS], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class ListQueue(Queue):
    """A Redis list of JSON messages carrying the job's class, lock key, token and arguments."""

    def __init__(self, name: str = "jobs") -> None:
        self.name = name
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(os.environ[QUEUE_URL])
        return self._client

    def push(
        self, job_cls: type[UniqueJob], lock: JobLock, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        die = os.environ.get(DIE_ON_PUSH)
        if die == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        message = json.dumps(
            {"cls": job_cls.__name__, "key": lock.key, "token": lock.token, "args": list(args)}
        )
        self.client.rpush(self.name, message)
        if die == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return lock.token


QUEUE = ListQueue()


class Pipeline(UniqueJob):
    """Two at a time per key; random run times."""

    unique_queue = QUEUE
    unique_run_lease = 3.0
    concurrency_limit = 2
    concurrency_duration = 10

    @classmethod
    def concurrency_key(cls, job: int, key: int, pause: float) -> str:
        return f"k{key}"

    def perform(self, job: int, key: int, pause: float) -> None:
        event("S", job, f"k{key}")
        time.sleep(pause)
        event("E", job, f"k{key}")


class Fifo(UniqueJob):
    """One at a time: promotions, hence starts, must follow the enqueue order."""

    unique_queue = QUEUE
    unique_run_lease = 3.0
    concurrency_limit = 1
    concurrency_duration = 10

    def perform(self, job: int, pause: float) -> None:
        event("S", job, "fifo")
        time.sleep(pause)
        event("E", job, "fifo")


class InlinePipeline(UniqueJob):
    """No queue: callers wait in their own process for one of two slots."""

    unique_run_lease = 3.0
    concurrency_limit = 2
    concurrency_duration = 10

    def perform(self, job: int, pause: float) -> None:
        event("S", job, "inline")
        time.sleep(pause)
        event("E", job, "inline")


JOBS: dict[str, type[UniqueJob]] = {"Pipeline": Pipeline, "Fifo": Fifo}


def worker(url: str) -> None:
    """Run jobs from the list until the test sets ``stop``; ack each one after it ends."""
    uniqjob.configure(url)
    client = QUEUE.client
    mine = f"processing:{os.getpid()}"
    client.sadd("ready", os.getpid())
    while not client.exists("stop"):
        raw: Any = client.blmove(QUEUE.name, mine, 0.2, "LEFT", "RIGHT")  # type: ignore[arg-type]
        if raw is None:
            continue
        message = json.loads(raw)
        job_cls = JOBS[message["cls"]]
        job_cls.execute(job_cls.lock_from(message["key"], message["token"]), message["args"], {})
        client.lrem(mine, 1, raw)


def promoter(url: str) -> None:
    """Run the one job in the list; its end promotes a parked job, and this process dies pushing it."""
    uniqjob.configure(url)
    client = QUEUE.client
    raw: Any = client.lpop(QUEUE.name)
    assert raw is not None
    message = json.loads(raw)
    job_cls = JOBS[message["cls"]]
    job_cls.execute(job_cls.lock_from(message["key"], message["token"]), message["args"], {})


def inline_caller(url: str, jobs: list[int], seed: int) -> None:
    """Call ``InlinePipeline.run`` for each job in turn, waiting for a slot each time."""
    uniqjob.configure(url)
    rng = random.Random(seed)
    for job in jobs:
        InlinePipeline.run(job, rng.uniform(0.01, 0.05))
