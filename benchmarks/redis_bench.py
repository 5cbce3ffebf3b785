"""The Redis sections: uniqjob's operations beside its peers, and beside 100k held locks."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import redis

from benchmarks.report import Report, Row, Target
from benchmarks.sampling import Op, Paired, interleaved
from benchmarks.workload import Workload, job_class
from uniqjob.locks import RunClaim, local_holder
from uniqjob.stores.redis import RedisBackend

__all__ = ["ACKED", "LABELS", "LAYERS", "load_locks", "run_redis", "run_replicas", "run_scale"]

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

PEER_NAMES = {"redis_py": "redis-py Lock", "redis_lock": "python-redis-lock"}
PEER_LABELS = {
    "acquire": "acquire (free)",
    "acquire_held": "acquire (held, non-blocking): rejected",
    "cycle": "acquire + release",
    "cycle3": "acquire + extend + release",
}
# uniqjob's operation -> the peer's operation doing the same work (a full cycle
# is three transitions: take, start with a lease, release).
PEER_MATCH = {"fresh": "acquire", "duplicate": "acquire_held", "cycle": "cycle3"}


def peer_missing(peer: str) -> str | None:
    """Return why ``peer`` cannot be timed, or None if it can."""
    if peer == "redis_lock":
        try:
            import redis_lock  # noqa: F401
        except ImportError:
            return "python-redis-lock is not installed (pip install -e '.[bench]')"
    return None


def _peer_ops(client: redis.Redis, peer: str) -> dict[str, Op]:
    """The peer's lock doing each piece of uniqjob's work; a fresh name for every call."""
    names = (f"peer:{peer}:{n}" for n in itertools.count())
    held = f"peer:{peer}:held"
    make: Callable[..., object]
    if peer == "redis_py":

        def make(name: str, expire: int = 30) -> object:
            return client.lock(name, timeout=expire)

        def extend(lock: object) -> None:
            lock.extend(30.0, replace_ttl=True)  # type: ignore[attr-defined]

    else:
        import redis_lock

        # Its failed non-blocking acquire logs a WARNING per call: keep the run quiet and fair.
        logging.getLogger("redis_lock").setLevel(logging.ERROR)

        def make(name: str, expire: int = 30) -> object:
            return redis_lock.Lock(client, name, expire=expire)

        def extend(lock: object) -> None:
            lock.extend(30)  # type: ignore[attr-defined]

    def take(lock: object) -> bool:
        return bool(lock.acquire(blocking=False))  # type: ignore[attr-defined]

    if not take(make(held, 86_400)):  # held for the whole run, however long it takes
        raise RuntimeError(f"{held} was already held: use a fresh store")

    def acquire() -> Callable[[], object]:
        lock = make(next(names))
        if not take(lock):
            raise RuntimeError("a fresh peer lock was already held")
        return lock.release  # type: ignore[attr-defined, no-any-return]

    def acquire_held() -> None:
        if take(make(held)):
            raise RuntimeError("the peer let a duplicate through")

    def cycle() -> None:
        lock = make(next(names))
        take(lock)
        lock.release()  # type: ignore[attr-defined]

    def cycle3() -> None:
        lock = make(next(names))
        take(lock)
        extend(lock)
        lock.release()  # type: ignore[attr-defined]

    return {"acquire": acquire, "acquire_held": acquire_held, "cycle": cycle, "cycle3": cycle3}


def _empty_script(client: redis.Redis) -> tuple[Any, ...]:
    """The floor of any one-script transition: the same request, a script that does nothing."""
    sha = client.script_load("return 1")
    name = "uniqjob:{benchmarks.workload.SendReport:1:0123456789abcdef0123456789abcdef}"
    return (
        "EVALSHA",
        sha,
        2,
        name + ":q",
        name + ":r",
        "0123456789abcdef01234567",
        0,
        "",
        "30",
        "1234",
        "",
        "q",
    )


def _floors(client: redis.Redis) -> list[tuple[str, str, Op]]:
    """PING and the empty script through redis-py: what the backend's calls go through too."""
    request = _empty_script(client)

    def evalsha() -> None:
        client.execute_command(*request)  # type: ignore[no-untyped-call]

    rows: list[tuple[str, str, Op]] = [
        ("redis.ping", "Redis · PING (the floor, timed against itself)", client.ping),
        ("redis.evalsha", "Redis · EVALSHA of an empty script, a claim's keys and arguments", evalsha),
    ]
    return rows


def run_redis(report: Report, client: redis.Redis, iterations: int, warmup: int) -> None:
    """Time uniqjob's operations and its peers', all round-robin, each alternately with PING."""
    ping = client.ping
    backend = RedisBackend(client, namespace="bench")
    series = _floors(client)
    for name, op in Workload(backend).ops().items():
        series.append((f"redis.{name}", f"Redis · {LABELS[name]}", op))
    skipped: list[Row] = []
    for peer, peer_name in PEER_NAMES.items():
        missing = peer_missing(peer)
        ops = {} if missing else _peer_ops(client, peer)
        for name, label in PEER_LABELS.items():
            row_id, row_label = f"peers.{peer}.{name}", f"Peer · {peer_name} {label}"
            if missing:
                skipped.append(Row(row_id, row_label, skipped=missing))
            else:
                series.append((row_id, row_label, ops[name]))
    results = interleaved([(ping, op) for _, _, op in series], iterations, warmup)
    for (row_id, label, _), sample in zip(series, results, strict=True):
        report.rows.append(Row.timed(row_id, label, sample, "PING"))
    report.rows += skipped

    for name, limit in (("fresh", 1.3), ("duplicate", 1.3), ("cycle", 3.6)):
        for layer, layer_name in LAYERS.items():
            row = report.row(f"redis.{layer}.{name}")
            report.targets.append(
                Target(f"redis.{layer}.{name}", f"Redis {name} ({layer_name}) vs PING", row.ratio, limit, "x")
            )
    for ours, theirs in PEER_MATCH.items():
        peers = [report.row(f"peers.{p}.{theirs}") for p in PEER_NAMES if not peer_missing(p)]
        cheapest = min(peers, key=lambda r: r.ratio or 0.0)
        for layer, layer_name in LAYERS.items():
            mine = report.row(f"redis.{layer}.{ours}")
            assert mine.ratio is not None and cheapest.ratio is not None
            report.targets.append(
                Target(
                    f"peers.{layer}.{ours}",
                    f"Redis {ours} ({layer_name}) vs the cheapest peer's {PEER_LABELS[theirs]}",
                    mine.ratio / cheapest.ratio,
                    1.0,
                    "x",
                    note=cheapest.label.split(" · ")[1].split(" acquire")[0],
                )
            )


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
