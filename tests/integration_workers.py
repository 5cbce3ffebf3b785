"""Real worker processes for the RQ and Celery integration tests, and the gates their jobs wait on.

A test job records that it started (and its pid), then waits until the test
opens its gate, all through keys in the test's Redis: the test decides when
a job ends, and sees how many times it ran, without sleeping.

Workers start in sessions of their own, and each with every process it
started (RQ's work horses and scheduler, Celery's pool children) is SIGKILLed
when the test ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
#: The Redis the jobs' gates (and RQ, and Celery's broker) live in.
URL_VAR = "UNIQJOB_TEST_REDIS_URL"
#: Set in a worker's environment to make it look like another machine (see pretend_other_host).
NODE_VAR = "UNIQJOB_TEST_NODE"

JOB_TIMEOUT = 30.0  # a gate never opened fails the job instead of hanging the worker


def pretend_other_host() -> None:
    """In a worker started with NODE_VAR: report another pid space, so only the lease can tell it died."""
    node = os.environ.get(NODE_VAR)
    if node:
        from uniqjob import locks

        # _node fingerprints the pid space; a holder in another one is never checked by pid.
        setattr(locks, "_node", lambda: node)  # noqa: B010 - a test-only override of a private


def client() -> redis.Redis:
    """A client of the test Redis (job side and test side)."""
    return redis.Redis.from_url(os.environ[URL_VAR])


# -- job side ---------------------------------------------------------------------------


def job_started(r: redis.Redis, name: str) -> int:
    """Record a start of job ``name`` and this process's pid; return the attempt number (1, 2, ...)."""
    pipe = r.pipeline()
    pipe.incr(f"started:{name}")
    pipe.rpush(f"pids:{name}", os.getpid())
    attempt, _ = pipe.execute()
    return int(attempt)


def wait_for_gate(r: redis.Redis, gate: str) -> None:
    """Block until the test opens ``gate``; fail after JOB_TIMEOUT."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not r.exists(f"go:{gate}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate!r} never opened")
        time.sleep(0.01)


def job_done(r: redis.Redis, name: str) -> None:
    """Record that job ``name`` ran to its end."""
    r.incr(f"done:{name}")


# -- test side --------------------------------------------------------------------------


def open_gate(r: redis.Redis, gate: str) -> None:
    """Let the job waiting at ``gate`` finish."""
    r.set(f"go:{gate}", 1)


def count(r: redis.Redis, what: str, name: str) -> int:
    """How many times job ``name`` has ``what`` ("started" or "done")."""
    return int(r.get(f"{what}:{name}") or 0)


def wait_until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> float:
    """Poll ``condition`` until it is true; return the seconds it took; fail after ``timeout``."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - began


@contextlib.contextmanager
def worker_pool(url: str, directory: Path) -> Iterator[Workers]:
    """Workers whose jobs use the Redis at ``url`` for their gates, queues and locks; killed after."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    pool = Workers(directory, {URL_VAR: url, "UNIQJOB_URL": url, "PYTHONPATH": path})
    try:
        yield pool
    finally:
        pool.close()


class Workers:
    """Starts worker processes, each in its own session, and kills them and their children at the end."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` as worker ``name``; its output goes to ``<name>.log`` (shown if the test fails)."""
        with open(self.directory / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**os.environ, **self.env, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL worker ``name`` and every process it started: a crashed machine, not a shutdown."""
        proc = self.procs[name]
        if proc.poll() is not None:
            return  # gone and reaped: its pid may belong to someone else by now
        # Freeze first, so that nothing forks a process we would miss (a work horse for
        # the next job), then kill what is frozen.
        frozen: set[int] = set()
        while new := set(_family(proc.pid)) - frozen:
            _signal(new, signal.SIGSTOP)
            frozen |= new
            wait_until(partial(_none_running, frozenset(frozen)), f"worker {name} to stop", timeout=10)
        _signal(frozen, signal.SIGKILL)
        proc.wait(10)
        # SIGKILL is delivered asynchronously: wait until each process is dead (gone, or a zombie
        # its new parent has yet to reap), as it would be after a machine died.
        wait_until(lambda: not any(alive(pid) for pid in frozen), f"worker {name} to die", timeout=10)

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        """Kill every worker still running and print their logs (pytest shows them for a failed test)."""
        for name in self.procs:
            self.kill(name)
            print(f"----- worker {name} -----\n{self.log(name)[-4000:]}")


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def alive(pid: int) -> bool:
    """True while ``pid`` runs or is stopped (gone, a zombie or dead: False); reads /proc (Linux)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X", b"T", b"t")


def _none_running(pids: frozenset[int]) -> bool:
    return not any(_running(pid) for pid in pids)


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _family(leader: int) -> list[int]:
    """Worker ``leader`` and every process it started: its session, and its descendants.

    Both, because a child may leave the session (RQ 2.0's work horse calls setsid).
    """
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None:
            parents[int(entry)] = int(fields[1])  # fields 4 and 6 of proc(5): ppid, session id
            sessions[int(entry)] = int(fields[3])
    found = {leader} | {pid for pid, sid in sessions.items() if sid == leader}
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return [leader, *sorted(found - {leader})]


def python() -> str:
    """The interpreter of this test run (its venv has rq and celery)."""
    return sys.executable
