"""More Redis sections: acknowledged by a replica, and beside 100k held locks (the main one: redis_floor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from benchmarks.replay import Raw, record
from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Paired, interleaved
from benchmarks.workload import Workload, job_class
from uniqjob.stores.redis import RedisBackend

__all__ = ["ACKED", "LABELS", "LAYERS", "SCALED", "load_locks", "run_replicas", "run_scale"]

#: The operations the scale section times with many locks held and with none.
SCALED = ("joblock.fresh", "job.fresh", "joblock.duplicate", "job.duplicate")
LABELS = {
    "joblock.fresh": "fresh enqueue · JobLock.acquire",
    "job.fresh": "fresh enqueue · UniqueJob.enqueue",
    "joblock.duplicate": "duplicate rejected · JobLock.acquire",
    "job.duplicate": "duplicate rejected · UniqueJob.enqueue",
    "job.keep_last": "duplicate coalesced (keep_last) · UniqueJob.enqueue",
    "job.debounce": "duplicate debounced · UniqueJob.enqueue",
    "joblock.cycle": "full cycle · JobLock acquire, running(), release",
    "job.cycle": "full cycle · enqueue, then lock_from() + execute()",
}
LAYERS = {"joblock": "JobLock", "job": "UniqueJob"}
# The operations timed with replica acknowledgement (replicas=1), each beside the same without it.
ACKED = ("joblock.fresh", "job.fresh", "joblock.cycle", "job.cycle")


def run_replicas(report: Report, client: redis.Redis, iterations: int, warmup: int) -> None:
    """Time fresh enqueue and the full cycle on a master with one replica: plain, and with ``replicas=1``.

    Both are sampled in the same rounds, each alternately with PING on that master,
    so the rows' ratios differ only by the wait for the replica's acknowledgement.
    """
    plain = Workload(RedisBackend(client, namespace="plain")).ops()
    acked = Workload(RedisBackend(client, namespace="acked", replicas=1, replica_timeout=1.0)).ops()
    series = [(client.ping, plain[name]) for name in ACKED] + [(client.ping, acked[name]) for name in ACKED]
    results = interleaved(series, iterations, warmup)
    for i, name in enumerate(ACKED):
        without, with_acks = results[i], results[i + len(ACKED)]
        label = LABELS[name]
        report.rows.append(
            Row.timed(f"replicas.{name}.plain", f"Redis + 1 replica, replicas=0 · {label}", without, "PING")
        )
        report.rows.append(
            Row.timed(f"replicas.{name}", f"Redis + 1 replica, replicas=1 · {label}", with_acks, "PING")
        )
    report.figures.update(
        {
            f"replicas_{name.replace('.', '_')}_added_us": round(
                results[i + len(ACKED)].op.median_us - results[i].op.median_us, 1
            )
            for i, name in enumerate(ACKED)
        }
    )


def load_locks(backend: RedisBackend, count: int, *, first_id: int, running: bool = False) -> list[list[Any]]:
    """Take ``count`` queue locks (``running``: with their run locks) in pipelined batches; return
    the Redis keys the first 1,000 wrote.

    One lock is taken for real, ``job.lock(...).acquire(run=running)`` (as an enqueue
    takes it, or ``Job.run()`` with both locks: its run lock records the attempt
    too), and its commands recorded
    (``benchmarks.replay``); the rest are those commands on fresh keys of the same
    length, a thousand per round trip, so 100k load in seconds.
    """
    client = backend.client
    job = job_class(backend)
    # Keys of their own (ids just past the range: not the Workload's), with a preview of usual length.
    warm = job.lock(first_id + count + 1)
    warm.acquire(run=running)  # its scripts loaded: the recording holds the claim alone
    warm.release()
    lock = job.lock(first_id + count)
    sent, taken = record(client, lambda: lock.acquire(run=running))
    if not taken:
        raise RuntimeError(f"{lock.key} was already held: use a fresh store")
    raw = Raw(client, sent, fresh=True)
    pipe = client.pipeline(transaction=False)
    written: list[list[Any]] = []
    for i in range(count):
        commands, keys = raw.fresh_commands()
        for args in commands:
            pipe.execute_command(*args)  # type: ignore[no-untyped-call]
        if i < 1000:
            written.append(keys)
        # Taken: 1, or with a run lock its fence; a conflict is a snapshot string.
        if (len(pipe) >= 1000 or i == count - 1) and any(type(r) is not int for r in pipe.execute()):
            raise RuntimeError("a lock loaded for the scale section was already held")
    return written


def bytes_per_lock(client: redis.Redis, locks: list[list[Any]]) -> float:
    """Redis memory per lock of ``locks`` (each the keys one lock wrote: :func:`load_locks`).

    ``MEMORY USAGE`` of each key the lock wrote (key, value and entry), summed, averaged over the
    locks: exact and the same on every run, where an ``INFO memory`` delta moves by tens of
    kilobytes with the keyspace's table growth and client buffers. Not counted: the keyspace's
    own tables (a few bytes per key, amortised).
    """
    pipe = client.pipeline(transaction=False)
    for keys in locks:
        for key in keys:
            pipe.memory_usage(key, samples=0)
    used: list[int | None] = pipe.execute()
    total = sum(n for n in used if n is not None)
    if not total:  # the keys named here are not the ones the locks wrote: no figure rather than 0
        raise RuntimeError(f"none of the keys of the {len(locks)} locks loaded exist")
    return total / len(locks)


def run_scale(
    report: Report,
    empty: redis.Redis,
    loaded: redis.Redis,
    *,
    held: int,
    iterations: int,
    warmup: int,
    progress: Callable[[str], None],
) -> None:
    """Fill ``loaded`` with ``held`` locks; time enqueue on it and on ``empty``, round-robin.

    Redis memory per lock: :func:`bytes_per_lock`.
    """
    backend = RedisBackend(loaded, namespace="scale")
    load_locks(backend, 10, first_id=10**9)  # scripts loaded, pool warm
    progress(f"loading {held:,} queue locks")
    queued = load_locks(backend, held, first_id=0)
    running = max(1, held // 10)
    runs = load_locks(backend, running, first_id=2 * 10**9, running=True)
    per_lock = bytes_per_lock(loaded, queued)
    report.figures.update(
        held_locks=held,
        redis_bytes_per_queued_lock=round(per_lock, 1),
        redis_bytes_per_running_job=round(bytes_per_lock(loaded, runs), 1),
    )
    report.targets.append(Target("scale.memory", "Redis memory per held (queued) lock", per_lock, 256, "B"))

    names = SCALED
    full = Workload(backend, first_id=3 * 10**9).ops()
    bare = Workload(RedisBackend(empty, namespace="scale"), first_id=3 * 10**9).ops()
    series = [(empty.ping, bare[n]) for n in names] + [(loaded.ping, full[n]) for n in names]
    results = interleaved(series, iterations, warmup)
    for i, name in enumerate(names):
        without, with_held = results[i], results[i + len(names)]
        label = f"Redis, {held:,} locks held · {LABELS[name]}"
        report.rows.append(Row.timed(f"scale.{name}", label, with_held, "PING"))
        empty_label = f"Redis, none held, same rounds · {LABELS[name]}"
        report.rows.append(Row.timed(f"scale.{name}.empty", empty_label, without, "PING"))
        layer, op = name.split(".")
        report.targets.append(
            Target(
                f"scale.{name}",
                f"{op} ({LAYERS[layer]}) with {held:,} locks held vs none",
                _change(without, with_held),
                10.0,
                "%",
            )
        )


def _change(before: Paired, after: Paired) -> float:
    return 100 * (after.cost_us / before.cost_us - 1)
