"""``python -m benchmarks``: run the sections, print the tables (or JSON)."""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks.report import Report, Target

__all__ = ["SECTIONS", "main"]

SECTIONS = (
    "redis",
    "replicas",
    "asyncio",
    "parallel",
    "scale",
    "file",
    "memory",
    "queues",
    "apscheduler",
    "huey",
    "django",
    "startup",
)


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def _count(text: str) -> int:
    return _whole(text, 1)


def _warmup(text: str) -> int:
    return _whole(text, 0)


def _sections(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown section {', '.join(unknown) or repr(text)}: choose from {', '.join(SECTIONS)}"
        )
    return chosen


def parser() -> argparse.ArgumentParser:
    """Return the command's argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time uniqjob's locks against their floor (their own raw Redis calls, a bare FileLock), "
        "beside their peers, and at scale.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    p.add_argument("--quick", action="store_true", help="a short smoke run: few iterations, 2,000 held locks")
    p.add_argument(
        "--iterations",
        type=_count,
        help="samples per Redis and memory operation; rounds of the redis section (default 1000)",
    )
    p.add_argument("--file-iterations", type=_count, help="samples per file operation (default 500)")
    p.add_argument(
        "--warmup", type=_warmup, help="untimed calls before each series (default: 1/10, at most 200)"
    )
    p.add_argument(
        "--counted", type=_count, help="calls per operation whose round trips are counted (default 20)"
    )
    p.add_argument("--held", type=_count, help="locks held for the scale section (default 100000)")
    p.add_argument(
        "--starts", type=_count, help="paired starts of `uniqjob run` and `python -c pass` (default 30)"
    )
    p.add_argument(
        "--processes", type=_count, default=8, help="processes in the parallel section (default 8)"
    )
    p.add_argument("--parallel-ops", type=_count, help="cycles per process per phase (default 300)")
    p.add_argument(
        "--rounds", type=_count, help="alternating PING/cycle rounds in the parallel section (default 3)"
    )
    p.add_argument(
        "--unix", action="store_true", help="talk to redis-server over its unix socket, not TCP loopback"
    )
    p.add_argument("--dir", type=Path, help="directory for the file backend (default: a new temporary one)")
    p.add_argument(
        "--only", type=_sections, help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}"
    )
    return p


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults left unset, from --quick or the full run."""
    quick = args.quick
    defaults = {
        "iterations": 150 if quick else 1000,
        "file_iterations": 60 if quick else 500,
        "held": 2000 if quick else 100_000,
        "parallel_ops": 20 if quick else 300,
        "rounds": 1 if quick else 3,
        "counted": 5 if quick else 20,
        "starts": 5 if quick else 30,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.warmup is None:
        args.warmup = min(200, args.iterations // 10)
    args.sections = args.only or list(SECTIONS)
    return args


def _parser_name() -> str:
    import importlib.util

    return "hiredis" if importlib.util.find_spec("hiredis") else "python"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    args = _settings(parser().parse_args(argv))
    try:
        from tests.redis_server import RedisServer
    except ImportError:
        print(
            "python -m benchmarks: run it from the repository root (needs tests/redis_server.py)",
            file=sys.stderr,
        )
        return 2

    began = time.monotonic()

    def progress(message: str) -> None:
        print(f"== {time.monotonic() - began:5.1f}s {message}", file=sys.stderr, flush=True)

    report = Report()
    try:
        server = RedisServer()
        server.start()
    except RuntimeError as exc:
        print(f"python -m benchmarks: cannot start redis-server: {exc}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="uniqjob-bench-"))
    try:
        url = server.unix_url if args.unix else server.url
        client = redis.Redis.from_url(url)
        report.meta = {
            "python": platform.python_version(),
            "redis-py": redis.__version__,
            "redis-server": client.info("server")["redis_version"],
            "parser (other sections)": _parser_name(),
            "transport": "unix socket" if args.unix else "TCP loopback",
            "cpus": _cpus(),
            "iterations": args.iterations,
            "file iterations": args.file_iterations,
            "held": args.held,
        }
        _run_sections(report, args, server=server, client=client, url=url, scratch=scratch, progress=progress)
    finally:
        server.close()
        shutil.rmtree(scratch, ignore_errors=True)
    report.meta["seconds"] = round(time.monotonic() - began, 1)
    print(report.to_json() if args.json else report.to_text())
    return 0


def _run_sections(
    report: Report,
    args: argparse.Namespace,
    *,
    server: Any,
    client: redis.Redis,
    url: str,
    scratch: Path,
    progress: Callable[[str], None],
) -> None:
    """Run each section ``args`` asks for, in order, into ``report``."""
    from benchmarks import async_bench, local_bench, parallel, redis_bench, redis_floor

    if "redis" in args.sections:
        redis_floor.run_section(
            report,
            client,
            url,
            iterations=args.iterations,
            warmup=args.warmup,
            counted=args.counted,
            progress=progress,
        )
    if "replicas" in args.sections:
        progress(f"replica acknowledgement: a replica of the server, {args.iterations} samples per operation")
        _with_replica(server, lambda: redis_bench.run_replicas(report, client, args.iterations, args.warmup))
    if "asyncio" in args.sections:
        progress(f"asyncio: {args.iterations} samples per operation, then concurrent arun()")
        async_bench.run_async(report, client, args.iterations, args.warmup, rounds=args.rounds + 2)
    if "parallel" in args.sections:
        progress(f"parallel: {args.processes} processes")
        parallel.run_parallel(report, url, args.processes, args.parallel_ops, args.rounds)
    client.flushall()
    if "scale" in args.sections:
        # Same server, another database: the same process and CPU placement for
        # both sides, and a keyspace of its own for the held locks.
        progress(f"scale: {args.held:,} locks held in database 1, none in database 0")
        loaded = redis.Redis.from_url(_database(url, 1))
        redis_bench.run_scale(
            report,
            client,
            loaded,
            held=args.held,
            iterations=args.iterations,
            warmup=args.warmup,
            progress=progress,
        )
        loaded.close()
    client.close()
    if "file" in args.sections:
        directory = args.dir or scratch / "file"
        progress(f"file backend in {directory}: {args.file_iterations} samples per operation")
        local_bench.run_file(report, directory, args.file_iterations, min(args.warmup, 50))
    if "memory" in args.sections:
        progress("memory backend")
        local_bench.run_memory(report, args.iterations, args.warmup)
    if "queues" in args.sections:
        from benchmarks import queues

        progress(f"queues: RQ, Celery, arq, Dramatiq enqueues, {args.iterations} samples each; RQ workers")
        queues.run_section(report, url, args.iterations, args.warmup)
    if "apscheduler" in args.sections:
        from benchmarks import apscheduler_bench

        progress(f"apscheduler: a job call, plain and under once_per_tick, {args.iterations} samples each")
        apscheduler_bench.run_section(report, url, args.iterations, args.warmup, args.counted)
    if "huey" in args.sections:
        from benchmarks import huey_bench

        progress(
            f"huey: plain, unique and duplicate enqueues, {args.iterations} samples each; a consumer's task"
        )
        huey_bench.run_section(report, url, args.iterations, args.warmup)
    if "django" in args.sections:
        from benchmarks import django_bench

        progress(f"django: enqueues on django-tasks-db and django-tasks-rq, {args.iterations} samples each")
        django_bench.run_section(report, url, args.iterations, args.warmup, args.counted)
    if "startup" in args.sections:
        progress(f"startup: `uniqjob run` on the file store vs `python -c pass`, {args.starts} pairs")
        run_startup(report, scratch / "startup", args.starts, warmup=3)


#: The limit of issue 22: `uniqjob run` on the file store starts within this many `python -c pass`.
STARTUP_LIMIT = 4.0


def _uniqjob_command() -> list[str]:
    """The ``uniqjob`` console script beside this interpreter, as cron runs it; else ``python -m uniqjob``."""
    script = Path(sys.executable).with_name("uniqjob")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "uniqjob"]


def startup_environment(state: Path) -> dict[str, str]:
    """The children's environment: a user's, with bytecode, on a file store of its own in ``state``.

    ``PYTHONDONTWRITEBYTECODE`` is dropped: set (as on some CI machines), every
    start would compile each module from source, which no user with ``.pyc``
    files pays. No ``UNIQJOB_URL``: the default store, the file store.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "UNIQJOB_URL")}
    env["XDG_STATE_HOME"] = str(state / "state")
    return env


def run_startup(report: Report, state: Path, starts: int, warmup: int) -> None:
    """Time ``uniqjob run --key k -- true`` (the file store) against ``python -c pass``, in turn.

    Whole processes, from the start to the exit, in pairs: the ratio is the median
    of each pair's ratio, so the machine's drift hits both alike.
    """
    import uniqjob

    compileall.compile_dir(Path(uniqjob.__file__).parent, quiet=1)  # no-op where .pyc files are current
    state.mkdir(parents=True, exist_ok=True)
    env = startup_environment(state)
    run = [*_uniqjob_command(), "run", "--key", "k", "--", "true"]
    bare = [sys.executable, "-c", "pass"]

    def timed(argv: list[str]) -> float:
        began = time.perf_counter()
        subprocess.run(argv, env=env, cwd=state, check=True, stdin=subprocess.DEVNULL)
        return time.perf_counter() - began

    for _ in range(warmup):  # the warm-up writes any .pyc still missing
        timed(run)
        timed(bare)
    pairs = [(timed(run), timed(bare)) for _ in range(starts)]
    run_s = statistics.median(a for a, _ in pairs)
    bare_s = statistics.median(b for _, b in pairs)
    ratio = statistics.median(a / b for a, b in pairs)
    report.figures["startup_uniqjob_run_ms"] = round(run_s * 1000, 1)
    report.figures["startup_python_pass_ms"] = round(bare_s * 1000, 1)
    report.figures["startup_ratio"] = round(ratio, 2)
    report.targets.append(
        Target(
            "startup.run",
            "`uniqjob run --key k -- true` (file store) vs `python -c pass`",
            ratio,
            STARTUP_LIMIT,
            "x",
            note=f"median of {starts} pairs, wall: {run_s * 1000:.1f} ms vs {bare_s * 1000:.1f} ms",
        )
    )


def _with_replica(server: Any, run: Callable[[], None]) -> None:
    """Run ``run`` while a replica of ``server`` (a redis-server of its own) is in sync; then stop it."""
    from tests.redis_server import RedisServer

    master = redis.Redis(port=server.port)
    master.config_set("repl-diskless-sync-delay", 0)  # the first sync at once, not 5 s later
    with RedisServer(extra_args=("--replicaof", "127.0.0.1", str(server.port))) as replica:
        deadline = time.monotonic() + 30
        while master.wait(1, 100) < 1:  # online, and every write so far acknowledged
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica on port {replica.port} did not come into sync")
        run()
    master.close()


def _database(url: str, db: int) -> str:
    """Return ``url`` (as RedisServer gives it) pointing at database ``db``."""
    if url.startswith("unix://"):
        return url.replace("?db=0", f"?db={db}")
    return url.rsplit("/", 1)[0] + f"/{db}"


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
