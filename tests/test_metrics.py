"""``uniqjob.metrics`` and ``uniqjob stats``: a known store state, read back through Prometheus' own parser.

The scene is real: a concurrency key at its limit with jobs parked behind a
dead worker's stale slot, held and orphaned unique locks, and duplicates
dropped by real enqueues, in a real redis-server (and the file store).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import uniqjob
from tests.conftest import SHARED_STORES, store_url
from tests.test_drops import Export
from uniqjob import ops, stores
from uniqjob.concurrency import store_for
from uniqjob.errors import BackendError
from uniqjob.locks import Holder, QueueMeta, RunClaim, local_holder
from uniqjob.metrics import UniqjobCollector, render
from uniqjob.stores.base import Backend
from uniqjob.stores.semaphores import Park

LIMITED = "app.jobs.Limited"


def dead_holder() -> Holder:
    """A holder on this host whose process has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 1)


@dataclass
class Scene:
    """A store in a known state; ``unchanged()`` says whether it still is."""

    url: str
    backend: Backend
    queued: str
    before: Any = None

    def snapshot(self) -> Any:
        rows = sorted((r.key, r.state, r.orphaned) for r in ops.iter_rows(self.backend))
        keys = sorted((k.key, k.held, k.stale, k.parked) for k in ops.iter_keys(self.backend))
        return rows, keys, ops.duplicates(self.backend)

    def unchanged(self) -> bool:
        return bool(self.snapshot() == self.before)


@pytest.fixture(params=SHARED_STORES)
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    url = store_url(request, tmp_path)
    backend = stores.from_url(url)
    uniqjob.configure(backend)
    slots = store_for(backend)
    me, dead = local_holder(), dead_holder()

    def take(key: str, token: str, limit: int, holder: Holder | None, park: Park | None = None) -> str:
        outcome = slots.acquire(
            key, token, limit=limit, lease=600, running=holder is not None, holder=holder, park=park,
            job_class=LIMITED, args="(1,)", caller=me,
        )  # fmt: skip
        return str(outcome.status)

    # A key at its limit: a live worker's slot, a dead worker's (stale), and two jobs parked behind them.
    assert take(f"{LIMITED}:full", "alive", 2, me) == "taken"
    assert take(f"{LIMITED}:full", "crashed", 2, dead) == "taken"
    for n in range(2):
        assert take(f"{LIMITED}:full", f"parked{n}", 2, None, Park("queue", "{}")) == "parked"
    assert take(f"{LIMITED}:room", "other", 3, me) == "taken"  # a key with room to spare

    # Unique locks: two queued, one running, one orphaned (its holder died).
    meta = QueueMeta(Export.job_name(), "(1,)")
    for key in ("export-1", "export-2"):
        assert backend.claim(key, "t-" + key, meta=meta, ttl=600) is None
    assert backend.claim("running", "t-run", meta=meta, run=RunClaim(me, 600)) is None
    assert backend.claim("orphan", "t-orphan", meta=QueueMeta("app.Crashed"), run=RunClaim(dead, 600)) is None

    # Duplicates dropped by real enqueues: each run's inner call of the same key.
    Export.inner.clear()
    Export.enqueue(5)
    Export.enqueue(6)
    assert Export.inner == [None, None]

    # Coalesced and replaced calls: a debounced "keep_last" call taken over by a queued lock (now
    # due in 10 minutes), one pending behind the running call, and a "replace" that took export-2.
    latest = QueueMeta("app.Latest", "(2,)", call='{"a":[2],"k":{}}')
    for key, debounce in (("export-1", (600.0, None)), ("running", None)):
        state = backend.claim(
            key, "t-latest", meta=latest, count=True, coalesce="keep_last", debounce=debounce
        )
        assert state is not None and state.coalesced in ("latest", "pending")
    fresh = backend.claim("export-2", "t-fresh", meta=QueueMeta("app.Fresh"), count=True, coalesce="replace")
    assert fresh is not None and fresh.coalesced == "replaced"

    scene = Scene(url, backend, "export-1")
    scene.before = scene.snapshot()
    yield scene
    uniqjob.configure(None)


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_report_the_scene(scene: Scene) -> None:
    got = samples(render(scene.backend))
    age = got.pop(("uniqjob_concurrency_oldest_parked_age_seconds", ()))
    assert 0 <= age < 60
    assert got == {
        ("uniqjob_concurrency_parked_jobs", ()): 2,
        ("uniqjob_concurrency_slots_held", (("lease", "fresh"),)): 2,
        ("uniqjob_concurrency_slots_held", (("lease", "stale"),)): 1,
        ("uniqjob_concurrency_keys_at_limit", ()): 1,
        ("uniqjob_locks", (("state", "queued"),)): 2,
        ("uniqjob_locks", (("state", "running"),)): 2,
        ("uniqjob_locks_orphaned", ()): 1,
        ("uniqjob_locks_pending_calls", ()): 1,
        ("uniqjob_debounced_jobs", ()): 1,
        ("uniqjob_duplicates_total", (("job", Export.job_name()),)): 2,
        ("uniqjob_coalesced_total", (("job", "app.Latest"),)): 2,
        ("uniqjob_replaced_total", (("job", "app.Fresh"),)): 1,
    }
    assert scene.unchanged()  # a scrape only reads


def test_the_collector_reads_the_configured_store_at_each_scrape(scene: Scene) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(UniqjobCollector())  # no store: the configured one, when scraped
    assert samples(generate_latest(registry))[("uniqjob_locks_orphaned", ())] == 1
    assert (
        scene.backend.claim("orphan-2", "t", meta=QueueMeta("a.B"), run=RunClaim(dead_holder(), 600)) is None
    )
    assert samples(generate_latest(registry))[("uniqjob_locks_orphaned", ())] == 2
    assert samples(render())[("uniqjob_locks_orphaned", ())] == 2


def uniqjob_cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "uniqjob", *args]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)


def test_stats_prints_the_same_figures(scene: Scene) -> None:
    done = uniqjob_cli("stats", "--url", scene.url, "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    wait = figures["concurrency"].pop("oldest_wait_s")
    assert 0 <= wait < 60
    assert figures == {
        "locks": {"queued": 2, "running": 2, "orphaned": 1, "corrupt": 0, "pending": 1, "debouncing": 1},
        "concurrency": {"keys": 2, "slots_held": 3, "stale_slots": 1, "keys_at_limit": 1, "parked": 2},
        "duplicates": {Export.job_name(): 2},
        "coalesced": {"app.Latest": 2},
        "replaced": {"app.Fresh": 1},
        "window_s": 3600.0,
    }
    table = uniqjob_cli("stats", "--url", scene.url, "--window", "60")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[:5] == [
        "dropped duplicates, last 60s:",
        "   DROPPED  COALESCED  REPLACED  CLASS",
        f"         2          0         0  {Export.job_name()}",
        "         0          2         0  app.Latest",
        "         0          0         1  app.Fresh",
    ]
    assert lines[5] == "locks: 2 queued, 2 running, 1 orphaned, 1 with a pending call, 1 debouncing"
    assert lines[6].startswith(
        "concurrency: 2 key(s), 3 slot(s) held (1 stale), 1 at their limit, 2 job(s) parked"
    )


def test_locks_json_is_lock_rows_only(scene: Scene) -> None:
    """Every line of ``locks --json`` is a lock row (``jq .key``); the counts are in ``stats --json``."""
    done = uniqjob_cli("locks", "--url", scene.url, "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert all("key" in row and "duplicates" not in row for row in rows)
    assert {row["key"] for row in rows} == {"export-1", "export-2", "running", "orphan"}
    only = uniqjob_cli("locks", "--url", scene.url, "--json", "--class", "Crashed").stdout.splitlines()
    assert [json.loads(line)["key"] for line in only] == ["orphan"]


@pytest.mark.parametrize(
    ("window", "why"),
    [
        ("0", "expected seconds > 0 and <= 3600"),
        ("3601", "expected seconds > 0 and <= 3600"),
        ("x", "a number"),
    ],
)
def test_stats_refuses_a_window_it_cannot_answer_for(scene: Scene, window: str, why: str) -> None:
    done = uniqjob_cli("stats", "--url", scene.url, "--window", window)
    assert done.returncode == 64
    assert why in done.stderr


def test_an_empty_store_reports_zeros(tmp_path: Path) -> None:
    got = samples(render(stores.from_url((tmp_path / "locks").as_uri())))
    assert set(got.values()) == {0}
    assert ("uniqjob_duplicates_total", ()) not in got  # no class, no sample


def test_stats_counts_a_corrupt_record_and_exits_65(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    backend = stores.from_url(url)
    assert backend.claim("k", "t1", meta=QueueMeta("a.B")) is None
    (record,) = (tmp_path / "locks").glob("*.json")
    record.write_text("{not json")
    done = uniqjob_cli("stats", "--url", url, "--json")
    assert done.returncode == 65
    locks = {"queued": 0, "running": 0, "orphaned": 0, "corrupt": 1, "pending": 0, "debouncing": 0}
    assert json.loads(done.stdout)["locks"] == locks
    table = uniqjob_cli("stats", "--url", url)
    assert table.returncode == 65
    assert "locks: 0 queued, 0 running, 0 orphaned, 1 corrupt (see uniqjob locks)" in table.stdout


def test_a_scrape_of_an_unreachable_store_raises_a_backend_error_naming_it() -> None:
    down = stores.from_url("redis://127.0.0.1:1/0?timeout=2")  # nothing listens on port 1
    with pytest.raises(BackendError, match=r"127\.0\.0\.1:1"):
        render(down)
