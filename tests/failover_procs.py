"""The failover test's worker processes (see tests/test_failover.py).

A worker loops until ``DIRECTORY/stop`` exists: it picks one of a few keys and
calls ``FailoverJob.run(key)`` through a Sentinel ``master_for`` client, so the
calls follow the master across a failover. Each perform writes one JSON line,
``{"key", "start", "end", "pid"}``, once it ends (``performs-<pid>.jsonl``);
each call one line ``{"key", "began", "took", "outcome", "error", "backend"}``
(``calls-<pid>.jsonl``), where ``outcome`` is ``performed``, ``dropped`` (the
key was held) or ``failed``. Times are ``time.monotonic()``: one clock for every
process of the machine (Linux CLOCK_MONOTONIC).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from tests.support.topologies import SERVICE as TOPOLOGY_SERVICE
from uniqjob import BackendError, UniqueJob
from uniqjob.stores.redis import RedisBackend

#: Seconds a perform works.
PERFORM = 0.05
#: The clients' socket timeouts, and how long a grant waits for its replicas.
SOCKET_TIMEOUT = 1.0
REPLICA_TIMEOUT = 0.5
SERVICE = TOPOLOGY_SERVICE  # the name the test Sentinels monitor


def sentinel_backend(sentinels: list[int], replicas: int, namespace: str = "failover") -> RedisBackend:
    """A backend on the current master of :data:`SERVICE`, as the Sentinels on ``sentinels`` name it."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        [("127.0.0.1", port) for port in sentinels],
        socket_timeout=SOCKET_TIMEOUT,
        sentinel_kwargs={"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT},
    )
    client = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        SERVICE,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=Retry(NoBackoff(), 1),
    )
    return RedisBackend(client, namespace=namespace, replicas=replicas, replica_timeout=REPLICA_TIMEOUT)


class FailoverJob(UniqueJob):
    """Records when each perform of a key ran, and in which process."""

    unique_run_lease = 3.0
    performs: Path | None = None  # set by the worker

    def perform(self, key: int) -> str:
        start = time.monotonic()
        time.sleep(PERFORM)
        end = time.monotonic()
        assert self.performs is not None
        record = {"key": key, "start": start, "end": end, "pid": os.getpid()}
        with self.performs.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return "done"


def worker(sentinels: list[int], replicas: int, keys: int, directory: str) -> None:
    """Run :class:`FailoverJob` on random keys until ``directory/stop`` exists, logging every call."""
    logging.basicConfig(level=logging.ERROR)
    here = Path(directory)
    pid = os.getpid()
    FailoverJob.unique_backend = sentinel_backend(sentinels, replicas)
    FailoverJob.performs = here / f"performs-{pid}.jsonl"
    calls = (here / f"calls-{pid}.jsonl").open("a")
    while not (here / "stop").exists():
        key = random.randrange(keys)
        began = time.monotonic()
        entry: dict[str, Any] = {"key": key, "began": began, "error": "", "backend": False}
        try:
            entry["outcome"] = "dropped" if FailoverJob.run(key) is None else "performed"
        except Exception as exc:
            entry.update(outcome="failed", error=f"{type(exc).__name__}: {exc}"[:300])
            entry["backend"] = isinstance(exc, BackendError)
        entry["took"] = time.monotonic() - began
        calls.write(json.dumps(entry) + "\n")
        calls.flush()
        if entry["outcome"] == "failed":
            time.sleep(0.05)  # a store that is away: do not spin
