"""The fault soak: workers run jobs through random store and holder faults for minutes.

Run with ``pytest -q -s --soak tests/test_soak.py`` (skipped without ``--soak``;
the checks' own tests, at the end, run in the default suite).
``UNIQJOB_SOAK_SECONDS`` sets the long run's faulty phase (default 180 s);
``UNIQJOB_SOAK_REPORT`` names a JSON file that gets each run's figures, by test name;
``UNIQJOB_SOAK_SEED`` replays the faults' random choices (the seed is printed).

A private redis-server with an append-only file fsynced on every write (so a
SIGKILL and restart keeps its locks and its fences) serves ``WORKERS`` worker
processes (tests/soak_procs.py), each looping ``SoakJob.run(key)`` over
``KEYS`` keys. Every perform writes its steps, with the lock's fence, to a
resource that refuses a fence older than the newest it accepted. Meanwhile
the main thread stalls redis-server (SIGSTOP, at times for longer than the
5 s socket timeout), SIGKILLs and restarts it, and restarts it gracefully;
a second thread SIGKILLs workers (respawning them) and freezes them
(SIGSTOP for longer than the lease). At the end the soak checks what the
README promises:

- no two performs of one key overlap, except while one of them is a frozen
  holder (from its SIGSTOP until ``FREEZE_GRACE`` after its SIGCONT): the
  window the README says no lock can cover;
- fences are unique per key and increase from each perform to the next; the
  resource sees them strictly increasing, and refuses writes only of frozen
  holders;
- no lock is stranded: once the faults stop, every key can be claimed, and no
  key went without a perform for longer than the faults explain;
- a holder finds its lock lost only around a fault, and every exception that
  reaches a caller is a ``BackendError``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tests.soak_procs import FencedResource, SoakJob

REPO = Path(__file__).resolve().parent.parent
WORKERS = 6
KEYS = 3
LEASE = 3.0
#: Seconds a frozen holder may run on after its SIGCONT before it notices its lock is lost
#: (its next ``lock.lost`` check; a step is 0.1 s): part of the frozen holder's window.
FREEZE_GRACE = 1.0
#: Seconds a loss may be noticed after a store fault ends: the heartbeat retries within a
#: second, and a claim sent during a stall may be granted with its lease already spent.
LOSS_AFTER_FAULT = LEASE + 1.0
#: Seconds a key may go without a perform while the faults run. The longest the faults
#: explain is about a redis stall (up to 7 s) following the lapse of a frozen holder's
#: lease (3 s); a lock that blocks its key for good shows as a gap up to the end.
GAP_LIMIT = 20.0
AOF = ("--appendonly", "yes", "--appendfsync", "always")


@dataclass
class Fault:
    """One injected fault, from ``t0`` to ``t1`` (monotonic); ``pid``: the worker it hit."""

    kind: str
    t0: float
    t1: float
    pid: int | None = None


@dataclass
class Perform:
    """One perform as its worker logged it; ``end`` is the kill time if its worker was SIGKILLed."""

    key: int
    name: str
    pid: int
    fence: int | None
    start: float
    end: float = float("nan")
    written: int = 0
    refused: int = 0
    lost_at: float | None = None
    killed: bool = False


@dataclass
class Figures:
    """What one soak run saw: printed as a table and written as JSON."""

    seed: int = 0
    fault_seconds: float = 0.0
    run_seconds: float = 0.0
    workers: int = WORKERS
    keys: int = KEYS
    lease: float = LEASE
    performs: int = 0
    performs_per_key: dict[str, int] = field(default_factory=dict)
    performs_killed: int = 0
    performs_lost: int = 0
    performs_lost_before_first_step: int = 0
    performs_unfinished: int = 0
    busy_drops: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    redis_stalled_seconds: float = 0.0
    overlaps_in_frozen_window: int = 0
    overlaps_outside: int = 0
    fences_issued: int = 0
    fence_reused: int = 0
    fence_not_increasing: int = 0
    fence_changed_in_perform: int = 0
    resource_writes_accepted: int = 0
    resource_writes_refused: int = 0
    resource_refused_outside_frozen_window: int = 0
    resource_fence_not_increasing: int = 0
    lost_outside_faults: int = 0
    backend_errors: int = 0
    other_errors: int = 0
    stranded_locks: int = 0
    leftover_records: int = 0
    max_gap_seconds: dict[str, float] = field(default_factory=dict)
    frozen_tail_max_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


# -- the run -----------------------------------------------------------------------------


class Workers:
    """The worker processes: spawn, SIGKILL (respawning), freeze; thread-safe."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.logs, self.resources, self.stop_file = tmp / "logs", tmp / "resources", tmp / "stop"
        self.logs.mkdir()
        self.resources.mkdir()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._mutex = threading.Lock()
        self.stderr: dict[int, Path] = {}  # each worker's stderr: the library's warnings, any traceback
        self.killed: set[int] = set()

    def spawn(self) -> int:
        argv = [str(a) for a in (self.url, self.tmp, KEYS, LEASE)]
        code = "import sys; from tests.soak_procs import main; main(sys.argv[1:])"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self._mutex:
            path = self.logs / f"stderr-{len(self._procs)}.txt"
            with open(path, "wb") as stderr:
                proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=REPO, env=env, stderr=stderr)
            self._procs[proc.pid] = proc
            self.stderr[proc.pid] = path
            return proc.pid

    def alive(self) -> list[int]:
        with self._mutex:
            return [pid for pid, proc in self._procs.items() if proc.poll() is None]

    def performing(self) -> list[int]:
        """The live workers whose last logged event is the start of a perform."""
        return [pid for pid in self.alive() if _last_event(self.logs / f"events-{pid}.jsonl") == "start"]

    def kill(self, pid: int) -> float:
        """SIGKILL ``pid``, reap it, and return when it died."""
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        with self._mutex:
            self._procs[pid].wait(30)
            self.killed.add(pid)
        return killed

    def stop(self, timeout: float = 60.0) -> dict[int, int | None]:
        """Ask every live worker to finish its perform and exit; their exit codes (None: hung)."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        codes: dict[int, int | None] = {}
        with self._mutex:
            procs = {pid: proc for pid, proc in self._procs.items() if pid not in self.killed}
        for pid, proc in procs.items():
            try:
                codes[pid] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[pid] = None
        return codes

    def close(self) -> None:
        with self._mutex:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()


def _last_event(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2048))
            lines = f.read().splitlines()
        return str(json.loads(lines[-1])["ev"]) if lines else None
    except (OSError, ValueError, KeyError):
        return None


class Soak:
    """Drives the workers through faults for ``seconds``; collects what happened."""

    def __init__(self, server: RedisServer, tmp: Path, seconds: float, seed: int) -> None:
        self.server, self.seconds = server, seconds
        self.rng = random.Random(seed)
        self.workers = Workers(server.url, tmp)
        self.faults: list[Fault] = []
        self.codes: dict[int, int | None] = {}
        self.faults_ended = 0.0  # when the faults stopped and the workers were asked to stop
        self._done = threading.Event()
        self._holder_error: BaseException | None = None

    def run(self) -> None:
        """Spawn the workers, inject faults until the time is up, then stop the workers."""
        resource = FencedResource(self.workers.resources)
        for key in range(KEYS):
            resource.create(key)
        resource.close()
        for _ in range(WORKERS):
            self.workers.spawn()
        holder_faults = threading.Thread(target=self._holder_faults, name="soak-holder-faults")
        started = time.monotonic()
        holder_faults.start()
        try:
            # Store faults in the main thread: a restarted redis-server is tied (PDEATHSIG)
            # to the thread that started it, which must outlive it.
            while time.monotonic() - started < self.seconds:
                self._store_fault()
                # Redis is then away about a quarter of the time: enough to meet every other
                # fault, not so much that frozen holders never meet a healthy store.
                time.sleep(self.rng.uniform(3.0, 8.0))
        finally:
            self._done.set()
            holder_faults.join()
        if self._holder_error is not None:
            raise self._holder_error
        self.faults_ended = time.monotonic()
        self.codes = self.workers.stop()

    def _store_fault(self) -> None:
        kind = self.rng.choices(["redis_stall", "redis_kill", "redis_restart"], [6, 3, 1])[0]
        pid = self.server.pid
        assert pid is not None
        t0 = time.monotonic()
        if kind == "redis_stall":
            # Mostly shorter than the 5 s socket timeout (replies come late); one in four longer
            # (replies are lost: the claims they answer must be undone).
            seconds = self.rng.uniform(0.3, 4.0) if self.rng.random() < 0.75 else self.rng.uniform(5.5, 7.0)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif kind == "redis_kill":
            os.kill(pid, signal.SIGKILL)
            self.server.stop()  # reaps it
            self.server.start()  # the append-only file brings the locks and fences back
        else:
            self.server.restart()
        self.faults.append(Fault(kind, t0, time.monotonic()))

    def _holder_faults(self) -> None:
        try:
            while not self._done.wait(self.rng.uniform(1.0, 4.0)):
                self._holder_fault()
        except BaseException as exc:  # re-raised by run()
            self._holder_error = exc

    def _holder_fault(self) -> None:
        targets = self.workers.performing() or self.workers.alive()
        if not targets:
            return
        pid = self.rng.choice(targets)
        if self.rng.random() < 0.5:
            killed = self.workers.kill(pid)
            self.faults.append(Fault("worker_kill", killed, killed, pid))
            self.workers.spawn()
            return
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(LEASE + self.rng.uniform(0.5, 3.0))  # past the lease: its lock lapses on the store
        finally:
            os.kill(pid, signal.SIGCONT)
        self.faults.append(Fault("worker_freeze", t0, time.monotonic(), pid))


# -- what happened -----------------------------------------------------------------------


def _events(logs: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(logs.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def read_performs(logs: Path, faults: list[Fault], figures: Figures) -> list[Perform]:
    """Every perform from the workers' logs; errors and drops counted into ``figures``."""
    killed_at = {f.pid: f.t0 for f in faults if f.kind == "worker_kill"}
    performs: dict[str, Perform] = {}
    errors: Counter[str] = Counter()
    for ev in _events(logs):
        kind = ev["ev"]
        if kind == "start":
            performs[ev["perform"]] = Perform(ev["key"], ev["perform"], ev["pid"], ev["fence"], ev["t"])
        elif kind == "end":
            p = performs[ev["perform"]]
            p.end, p.written, p.refused, p.lost_at = ev["t"], ev["written"], ev["refused"], ev["lost_at"]
        elif kind == "busy":
            figures.busy_drops += 1
        elif kind == "error":
            if ev["kind"] == "BackendError":
                figures.backend_errors += 1
            else:
                figures.other_errors += 1
            errors[f"{ev['kind']}: {ev['msg'][:160]}"] += 1
    for p in performs.values():
        if math.isnan(p.end) and p.pid in killed_at:  # no end logged: SIGKILLed mid-perform
            p.end, p.killed = killed_at[p.pid], True
    figures.error_samples = [f"{n} x {msg}" for msg, n in errors.most_common(8)]
    return sorted(performs.values(), key=lambda p: p.start)


def _frozen(pid: int, since: float, until: float, faults: list[Fault]) -> bool:
    """True if [since, until] lies within a freeze of ``pid`` (SIGSTOP to SIGCONT + FREEZE_GRACE)."""
    return any(
        f.kind == "worker_freeze" and f.pid == pid and f.t0 <= since and until <= f.t1 + FREEZE_GRACE
        for f in faults
    )


def check_overlaps(performs: list[Perform], faults: list[Fault], figures: Figures) -> None:
    """Two performs of one key at once only inside a frozen holder's window."""
    by_key: dict[int, list[Perform]] = {}
    for p in performs:
        by_key.setdefault(p.key, []).append(p)
    for key, ps in by_key.items():
        for i, a in enumerate(ps):
            for b in ps[i + 1 :]:
                if b.start >= a.end:
                    break  # sorted by start: no later one overlaps a either
                since, until = b.start, min(a.end, b.end)
                if _frozen(a.pid, since, until, faults) or _frozen(b.pid, since, until, faults):
                    figures.overlaps_in_frozen_window += 1
                    continue
                figures.overlaps_outside += 1
                figures.violations.append(
                    f"overlap on key {key}: {a.name} (fence {a.fence}, {a.start:.3f}-{a.end:.3f}) and "
                    f"{b.name} (fence {b.fence}, {b.start:.3f}-{b.end:.3f})"
                )


def check_fences(performs: list[Perform], faults: list[Fault], figures: Figures) -> None:
    """Fences are unique per key, and each is greater than that of every perform that ended before it began.

    Skipped for a perform that began in its own frozen window: its claim may
    have been granted before the freeze, and others after.
    """
    seen: dict[tuple[int, int], str] = {}
    for p in performs:
        if p.fence is None:
            figures.violations.append(f"{p.name} on key {p.key} has no fence")
            continue
        figures.fences_issued += 1
        other = seen.setdefault((p.key, p.fence), p.name)
        if other != p.name:
            figures.fence_reused += 1
            figures.violations.append(f"fence {p.fence} of key {p.key} issued to {other} and to {p.name}")
    by_key: dict[int, list[Perform]] = {}
    for p in performs:
        by_key.setdefault(p.key, []).append(p)
    for key, ps in by_key.items():
        ended = sorted((p for p in ps if p.fence is not None), key=lambda p: p.end)
        highest: Perform | None = None
        j = 0
        for p in ps:  # by start
            while j < len(ended) and ended[j].end <= p.start:
                if highest is None or (ended[j].fence or 0) > (highest.fence or 0):
                    highest = ended[j]
                j += 1
            if p.fence is None or highest is None or _frozen(p.pid, p.start, p.start, faults):
                continue
            if p.fence <= (highest.fence or 0):
                figures.fence_not_increasing += 1
                figures.violations.append(
                    f"key {key}: {p.name} began at {p.start:.3f} with fence {p.fence}, not above fence "
                    f"{highest.fence} of {highest.name}, which ended at {highest.end:.3f}"
                )


def check_resource(
    resource: FencedResource, performs: list[Perform], faults: list[Fault], figures: Figures, keys: int = KEYS
) -> None:
    """What the resource saw: one fence per perform, new ones increasing, refusals only when frozen."""
    fence_of = {p.name: p.fence for p in performs}
    for key in range(keys):
        last_perform, last_fence = None, 0
        for seq, fence, perform, pid, t, accepted in resource.writes(key):
            if fence != fence_of.get(perform):
                figures.fence_changed_in_perform += 1
                figures.violations.append(
                    f"key {key}: write {seq} of {perform} carried fence {fence}, its perform began with "
                    f"{fence_of.get(perform)}"
                )
            if not accepted:
                figures.resource_writes_refused += 1
                if not _frozen(pid, t, t, faults):
                    figures.resource_refused_outside_frozen_window += 1
                    figures.violations.append(
                        f"key {key}: write {seq} of {perform} (fence {fence}, at {t:.3f}) refused, "
                        f"and its holder was not frozen"
                    )
                continue
            figures.resource_writes_accepted += 1
            if perform != last_perform and fence <= last_fence:
                figures.resource_fence_not_increasing += 1
                figures.violations.append(
                    f"key {key}: write {seq} of {perform} accepted with fence {fence}, "
                    f"after fence {last_fence} of {last_perform}"
                )
            last_perform, last_fence = perform, fence


def check_losses(performs: list[Perform], faults: list[Fault], figures: Figures) -> None:
    """A holder finds its lock lost only during a store fault (or soon after), or when it was frozen."""
    for p in performs:
        if p.lost_at is None:
            continue
        figures.performs_lost += 1
        if p.written == 0:
            figures.performs_lost_before_first_step += 1
        explained = _frozen(p.pid, p.lost_at, p.lost_at, faults) or any(
            f.kind.startswith("redis") and f.t0 <= p.lost_at <= f.t1 + LOSS_AFTER_FAULT for f in faults
        )
        if not explained:
            figures.lost_outside_faults += 1
            figures.violations.append(
                f"{p.name} on key {p.key} found its lock lost at {p.lost_at:.3f}, with no fault near"
            )


def check_gaps(
    performs: list[Perform], began: float, ended: float, figures: Figures, keys: int = KEYS
) -> None:
    """The longest time each key went without a perform (a stranded lock shows as a long gap)."""
    for key in range(keys):
        busy_until, gap = began, 0.0
        for p in (p for p in performs if p.key == key):
            gap = max(gap, p.start - busy_until)
            busy_until = max(busy_until, p.end)
        gap = max(gap, ended - busy_until)
        figures.max_gap_seconds[str(key)] = round(gap, 2)
        if gap > GAP_LIMIT:
            figures.violations.append(f"key {key} went {gap:.1f}s without a perform: a stranded lock?")


def check_tail(performs: list[Perform], faults: list[Fault], figures: Figures) -> None:
    """How long a frozen holder ran on after its SIGCONT (it must stay under FREEZE_GRACE)."""
    for f in faults:
        if f.kind != "worker_freeze":
            continue
        for p in performs:
            if p.pid == f.pid and p.start <= f.t1 and p.end >= f.t0 and not p.killed:
                figures.frozen_tail_max_seconds = max(figures.frozen_tail_max_seconds, round(p.end - f.t1, 3))


def check_stranded(url: str, monkeypatch: pytest.MonkeyPatch, figures: Figures) -> None:
    """Once the faults and the workers have stopped and a lease has passed, every key can be claimed."""
    monkeypatch.setattr(SoakJob, "unique_backend", url)
    monkeypatch.setattr(SoakJob, "unique_run_lease", LEASE)
    backend = SoakJob.backend()
    figures.leftover_records = len(list(backend.scan()))
    for key in range(KEYS):
        lock = SoakJob.lock(key)
        if lock.acquire(run=True):
            lock.release()
        else:
            figures.stranded_locks += 1
            figures.violations.append(f"key {key} is stranded: {lock.conflict and lock.conflict.describe()}")


# -- the report --------------------------------------------------------------------------


def report(title: str, figures: Figures) -> str:
    """The figures as a table, one per line, with every violation found."""
    rows = [(name, value) for name, value in dataclasses.asdict(figures).items() if name != "violations"]
    width = max(len(name) for name, _ in rows)
    lines = ["", f"uniqjob soak figures: {title}", "-" * (width + 30)]
    for name, value in rows:
        if isinstance(value, list):
            lines.append(f"{name:<{width}}  {len(value)}")
            lines.extend(f"{'':<{width}}    {item}" for item in value)
        else:
            lines.append(f"{name:<{width}}  {value}")
    lines.append(f"{'violations':<{width}}  {len(figures.violations)}")
    lines.extend(f"{'':<{width}}    {v}" for v in figures.violations[:40])
    return "\n".join(lines)


def soak(name: str, seconds: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Figures:
    """Run the soak for ``seconds`` of faults; print its figures (and record them as ``name``)."""
    figures = Figures(seed=int(os.environ.get("UNIQJOB_SOAK_SEED", time.time_ns() % 1_000_000)))
    with RedisServer(extra_args=AOF) as server:
        run = Soak(server, tmp_path, seconds, figures.seed)
        began = time.monotonic()
        try:
            run.run()
        finally:
            run.workers.close()
        figures.fault_seconds, figures.run_seconds = seconds, round(time.monotonic() - began, 1)
        time.sleep(LEASE + 1.0)  # every lease of a holder that died has lapsed
        check_stranded(server.url, monkeypatch, figures)
    # Kept beside the workers' logs, for a look at a failed run.
    (tmp_path / "faults.json").write_text(json.dumps([dataclasses.asdict(f) for f in run.faults], indent=1))
    analyse(run, began, figures)
    print(report(name, figures))
    write_report(name, figures)
    return figures


def analyse(run: Soak, began: float, figures: Figures) -> None:
    """Check what the workers and the resource saw against the faults; fill in ``figures``."""
    for pid, code in run.codes.items():
        if code != 0:
            how = "did not exit once asked to" if code is None else f"exited with {code}"
            stderr = run.workers.stderr[pid].read_text()[-2000:]
            figures.violations.append(f"worker {pid} {how}; its stderr ends:\n{stderr}")
    faults = run.faults
    figures.faults = dict(Counter(f.kind for f in faults))
    figures.redis_stalled_seconds = round(sum(f.t1 - f.t0 for f in faults if f.kind == "redis_stall"), 1)
    performs = read_performs(run.workers.logs, faults, figures)
    figures.performs = len(performs)
    figures.performs_per_key = dict(sorted(Counter(str(p.key) for p in performs).items()))
    figures.performs_killed = sum(p.killed for p in performs)
    unfinished = [p for p in performs if math.isnan(p.end)]
    figures.performs_unfinished = len(unfinished)
    figures.violations.extend(f"{p.name} on key {p.key} never ended and was not killed" for p in unfinished)
    finished = [p for p in performs if not math.isnan(p.end)]
    check_overlaps(finished, faults, figures)
    check_fences(finished, faults, figures)
    resource = FencedResource(run.workers.resources)
    check_resource(resource, performs, faults, figures)
    resource.close()
    check_losses(finished, faults, figures)
    check_gaps(finished, began, run.faults_ended, figures)
    check_tail(finished, faults, figures)


def write_report(name: str, figures: Figures) -> None:
    """Record ``figures`` under ``name`` in the JSON file UNIQJOB_SOAK_REPORT names, if set."""
    path = os.environ.get("UNIQJOB_SOAK_REPORT")
    if not path:
        return
    try:
        runs = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        runs = {}
    runs = runs if isinstance(runs, dict) else {}
    runs[name] = dataclasses.asdict(figures)
    Path(path).write_text(json.dumps(runs, indent=2) + "\n")


def assert_promises_held(figures: Figures) -> None:
    assert figures.performs > 0, "nothing ran"
    assert figures.violations == [], "\n".join(figures.violations[:20])
    assert figures.overlaps_outside == 0
    assert figures.stranded_locks == 0
    assert figures.fence_reused == figures.fence_not_increasing == figures.resource_fence_not_increasing == 0
    assert figures.resource_refused_outside_frozen_window == 0
    assert figures.other_errors == 0, figures.error_samples
    assert figures.frozen_tail_max_seconds <= FREEZE_GRACE


@pytest.mark.soak
def test_soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = float(os.environ.get("UNIQJOB_SOAK_SECONDS", "180"))
    assert_promises_held(soak("test_soak", seconds, tmp_path, monkeypatch))


@pytest.mark.soak
def test_soak_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same soak in 30 s, for a quick look."""
    assert_promises_held(soak("test_soak_short", 30.0, tmp_path, monkeypatch))


# -- the checks catch what they look for (fast; in the default run) -----------------------


def _perform(name: str, pid: int, fence: int, start: float, end: float, **more: Any) -> Perform:
    return Perform(key=0, name=name, pid=pid, fence=fence, start=start, end=end, **more)


def test_overlap_is_a_violation_unless_inside_a_frozen_holders_window() -> None:
    performs = [_perform("a", 1, 10, 0.0, 5.0), _perform("b", 2, 20, 4.0, 6.0)]
    caught = Figures()
    check_overlaps(performs, [], caught)
    assert caught.overlaps_outside == 1 and "overlap on key 0" in caught.violations[0]

    frozen = [Fault("worker_freeze", 1.0, 4.5, pid=1)]  # a ran on 0.5 s past its SIGCONT
    excused = Figures()
    check_overlaps(performs, frozen, excused)
    assert (excused.overlaps_outside, excused.overlaps_in_frozen_window, excused.violations) == (0, 1, [])

    too_long = [Fault("worker_freeze", 1.0, 4.5 - FREEZE_GRACE - 0.1, pid=1)]
    late = Figures()
    check_overlaps(performs, too_long, late)
    assert late.overlaps_outside == 1


def test_a_fence_issued_twice_or_not_above_an_earlier_one_is_a_violation() -> None:
    reused = Figures()
    check_fences([_perform("a", 1, 10, 0.0, 1.0), _perform("b", 2, 10, 2.0, 3.0)], [], reused)
    assert reused.fence_reused == 1
    lower = Figures()
    check_fences([_perform("a", 1, 10, 0.0, 1.0), _perform("b", 2, 9, 2.0, 3.0)], [], lower)
    assert lower.fence_not_increasing == 1
    fine = Figures()
    check_fences([_perform("a", 1, 10, 0.0, 1.0), _perform("b", 2, 11, 2.0, 3.0)], [], fine)
    assert (fine.fences_issued, fine.violations) == (2, [])


def test_the_resource_refuses_an_older_fence_and_a_refusal_outside_a_freeze_is_a_violation(
    tmp_path: Path,
) -> None:
    resource = FencedResource(tmp_path)
    resource.create(0)
    assert resource.write(0, 20, "new") and resource.write(0, 20, "new")  # the same holder again
    began = time.monotonic()
    assert not resource.write(0, 10, "old")  # a late write of an earlier holder
    performs = [_perform("new", os.getpid(), 20, 0.0, 1.0), _perform("old", os.getpid(), 10, 0.0, 1.0)]
    caught = Figures()
    check_resource(resource, performs, [], caught, keys=1)
    assert (caught.resource_writes_accepted, caught.resource_writes_refused) == (2, 1)
    assert caught.resource_refused_outside_frozen_window == 1
    frozen = [Fault("worker_freeze", began - 1.0, began, pid=os.getpid())]
    excused = Figures()
    check_resource(resource, performs, frozen, excused, keys=1)
    assert excused.violations == []
    resource.close()


def test_a_loss_far_from_any_fault_and_a_long_gap_are_violations() -> None:
    lost = [_perform("a", 1, 10, 0.0, 1.0, lost_at=0.9)]
    caught = Figures()
    check_losses(lost, [Fault("redis_stall", 10.0, 12.0)], caught)
    assert caught.lost_outside_faults == 1
    explained = Figures()
    check_losses(lost, [Fault("redis_stall", 0.2, 0.5)], explained)
    assert (explained.performs_lost, explained.violations) == (1, [])

    gap = Figures()
    check_gaps(
        [_perform("a", 1, 10, 0.0, 1.0), _perform("b", 2, 11, 1.0 + GAP_LIMIT + 1, 30.0)], 0.0, 30.0, gap
    )
    assert any("key 0 went" in v for v in gap.violations)


def test_a_key_held_by_a_live_process_counts_as_stranded(
    redis_server: RedisServer, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SoakJob, "unique_backend", redis_server.url)
    holder = SoakJob.lock(0)
    assert holder.acquire()  # queued, no expiry, held by this (live) process: never reclaimed
    caught = Figures()
    check_stranded(redis_server.url, monkeypatch, caught)
    assert caught.stranded_locks == 1 and "key 0 is stranded" in caught.violations[0]
    holder.release()
