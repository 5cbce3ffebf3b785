"""More Redis sections: acknowledged by a replica, and beside 100k held locks (the main one: redis_floor)."""

from __future__ import annotations

from collections.abc import Callable

import redis

from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Paired, interleaved
from benchmarks.workload import Workload, job_class
from uniqjob.locks import RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

__all__ = ["ACKED", "LABELS", "LAYERS", "load_locks", "run_replicas", "run_scale"]

LABELS = {
    "joblock.fresh": "fresh enqueue · JobLock.acquire",
    "job.fresh": "fresh enqueue · UniqueJob.enqueue",
    "joblock.duplicate": "duplicate rejected · JobLock.acquire",
    "job.duplicate": "duplicate rejected · UniqueJob.enqueue",
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


def load_locks(backend: RedisBackend, count: int, *, first_id: int, running: bool = False) -> None:
    """Take ``count`` queue locks (``running``: with their run locks) in pipelined batches.

    Each lock goes through the backend's own claim script with what ``enqueue``
    would send, but a thousand per round trip, so 100k load in seconds.
    """
    job = job_class(backend)
    run = RunClaim(local_holder(), 30.0) if running else None
    pipe = backend.client.pipeline(transaction=False)
    # Reaching into the backend on purpose: its claim script and argument layout
    # are what a real enqueue sends; the benchmark only batches them.
    for i in range(count):
        lock = job.lock(first_id + i)
        items = backend._items(
            lock.key, lock.token, lock.meta, None, flag="q" if run is None else "r", run=run
        )
        backend._claim(keys=items[:3], args=items[3:], client=pipe)  # three keys: the locks and the fence
        # Taken: 1, or with a run lock its fence; a conflict is a snapshot string.
        if (len(pipe) >= 1000 or i == count - 1) and any(type(r) is not int for r in pipe.execute()):
            raise RuntimeError("a lock loaded for the scale section was already held")


def bytes_per_lock(backend: RedisBackend, count: int, *, first_id: int) -> float:
    """Redis memory per lock of ``count`` loaded by :func:`load_locks` from ``first_id``.

    ``MEMORY USAGE`` of each key the lock wrote (key, value and entry), summed, averaged over the
    first 1,000: exact and the same on every run, where an ``INFO memory`` delta moves by tens of
    kilobytes with the keyspace's table growth and client buffers. Not counted: the keyspace's
    own tables (a few bytes per key, amortised).
    """
    job = job_class(backend)
    sample = min(count, 1000)
    pipe = backend.client.pipeline(transaction=False)
    for i in range(sample):
        for key in backend._keys(job.lock(first_id + i).key):
            pipe.memory_usage(key, samples=0)
    used: list[int | None] = pipe.execute()
    total = sum(n for n in used if n is not None)
    if not total:  # the keys named here are not the ones the locks wrote: no figure rather than 0
        raise RuntimeError(f"none of the keys of the {sample} locks loaded from {first_id} exist")
    return total / sample


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
    load_locks(backend, held, first_id=0)
    running = max(1, held // 10)
    load_locks(backend, running, first_id=2 * 10**9, running=True)
    per_lock = bytes_per_lock(backend, held, first_id=0)
    report.figures.update(
        held_locks=held,
        redis_bytes_per_queued_lock=round(per_lock, 1),
        redis_bytes_per_running_job=round(bytes_per_lock(backend, running, first_id=2 * 10**9), 1),
    )
    report.targets.append(Target("scale.memory", "Redis memory per held (queued) lock", per_lock, 256, "B"))

    names = ("joblock.fresh", "job.fresh", "joblock.duplicate", "job.duplicate")
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
