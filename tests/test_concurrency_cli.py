"""``uniqjob locks --concurrency``, ``release KEY`` and ``discard-parked KEY``, on files and on Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import uniqjob
from tests.concurrency_jobs import QUEUE, Limited
from tests.conftest import SHARED_STORES, store_url
from uniqjob.cli import main
from uniqjob.concurrency import Semaphore, store_for
from uniqjob.locks import Holder, local_holder

KEY1 = "tests.concurrency_jobs.Limited:order-1"
KEY2 = "tests.concurrency_jobs.Limited:order-2"


@pytest.fixture(params=SHARED_STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    target = store_url(request, tmp_path)
    uniqjob.configure(target)  # the jobs and the command share the store
    QUEUE.pushed.clear()
    yield target
    QUEUE.pushed.clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def dead_holder() -> Holder:
    proc = subprocess.Popen(["true"])
    proc.wait()
    me = local_holder()
    return Holder(me.host, me.node, proc.pid, 1)


def crashed_slot(semaphore: Semaphore) -> None:
    """A slot held by a worker that died, as a SIGKILL leaves it."""
    dead = dead_holder()
    semaphore.store.acquire(
        semaphore.key, "crashed", limit=semaphore.limit, lease=600, running=True, holder=dead, park=None,
        job_class="tests.concurrency_jobs.Limited", args="(1, 99)", caller=dead,
    )  # fmt: skip


def test_locks_concurrency_lists_busiest_first_with_totals(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "locks", "--concurrency", "--url", url) == (
        0,
        "",
        "no concurrency slots held, no jobs parked\n",
    )
    for n in range(5):
        Limited.enqueue(1, n)
    Limited.enqueue(2, 0)
    status, out, _ = run(capsys, "locks", "--concurrency", "--url", url)
    assert status == 0
    header, first, second, totals = out.splitlines()
    assert header.split() == ["HELD", "LEASE", "RUN", "PARKED", "WAITED", "KEY"]
    assert first.split()[:4] == ["2/2", "fresh", "0", "3"] and first.endswith(KEY1)
    assert second.split()[:4] == ["1/2", "fresh", "0", "0"] and second.endswith(KEY2)
    assert totals.startswith("2 key(s): 3 slot(s) held, 1 at their limit, 3 job(s) parked, oldest waiting ")
    # cut to the busiest key, the totals still count every key
    status, out, _ = run(capsys, "locks", "--concurrency", "--top", "1", "--url", url)
    assert out.splitlines()[1].endswith(KEY1)
    assert out.splitlines()[-1].startswith("2 key(s) (1 shown): 3 slot(s) held")


def test_locks_concurrency_json(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(3):
        Limited.enqueue(1, n)
    crashed_slot(Limited.semaphore(2))
    status, out, err = run(capsys, "locks", "--concurrency", "--json", "--top", "1", "--url", url)
    rows = [json.loads(line) for line in out.splitlines()]
    # JSON Lines of key rows only (as `locks --json`); the cut is said on stderr, the totals are stats'
    assert status == 0 and len(rows) == 1
    assert rows[0] == {
        "key": KEY1, "class": "tests.concurrency_jobs.Limited", "limit": 2, "held": 2, "running": 0,
        "fresh": 2, "stale": 0, "lease": "fresh", "at_limit": True, "parked": 1,
        "oldest_wait_s": rows[0]["oldest_wait_s"],
    }  # fmt: skip
    assert "1 more key(s) not shown (--top)" in err and "uniqjob stats --json" in err
    _, out, _ = run(capsys, "stats", "--json", "--url", url)
    totals = json.loads(out)["concurrency"]
    assert totals.pop("oldest_wait_s") >= rows[0]["oldest_wait_s"]  # read a moment later
    assert totals == {"keys": 2, "slots_held": 3, "stale_slots": 1, "keys_at_limit": 1, "parked": 1}
    _, out, _ = run(capsys, "locks", "--concurrency", "--json", "--class", "Nope", "--url", url)
    assert out == ""


def test_release_frees_stale_slots_and_promotes(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    semaphore = Limited.semaphore(1)
    crashed_slot(semaphore)
    Limited.enqueue(1, 0)  # the second slot
    QUEUE.pushed.clear()
    # parked behind the dead worker, straight in the store, as if nobody had looked at its liveness yet
    from uniqjob.concurrency import Park
    from uniqjob.concurrency.codec import encode_call

    payload = encode_call(Limited, (1, 1), {}, Limited.lock_key(1, 1))
    semaphore.store.acquire(
        semaphore.key, "waiting", limit=2, lease=60, running=False, holder=None, park=Park("queue", payload),
        job_class="", args="", caller=local_holder(),
    )  # fmt: skip
    status, out, err = run(capsys, "release", KEY1, "--url", url)
    assert status == 0
    assert out == f"released 1 slot(s) of {KEY1} (limit 2); promoted 1 parked\n"
    # the fresh slot (job 0, in its queue) is kept
    assert "kept 1 slot(s)" in err and "reserved in its queue" in err and "--force" in err
    assert [p[3] for p in QUEUE.pushed] == [(1, 1)]  # through the same guarded promotion
    assert len(semaphore.read().slots) == 2


def test_release_of_fresh_slots_needs_force_and_warns(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    semaphore = Limited.semaphore(1)
    for n in range(3):
        Limited.enqueue(1, n)
    QUEUE.pushed.clear()
    status, out, err = run(capsys, "release", KEY1, "--url", url)
    assert (status, out) == (1, "")
    assert "kept 2 slot(s)" in err
    status, out, err = run(capsys, "release", "--force", KEY1, "--url", url)
    assert status == 0
    assert out == f"released 2 slot(s) of {KEY1} (limit 2); promoted 1 parked\n"
    assert "WARNING: released 2 slot(s) whose lease was fresh" in err and "up to 4 may run at once" in err
    assert [p[3] for p in QUEUE.pushed] == [(1, 2)]
    assert len(semaphore.read().slots) == 1  # never past the limit


def test_release_of_an_unknown_key_still_says_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "release", "nothing-here", "--url", url) == (
        1,
        "",
        "uniqjob: no lock on 'nothing-here'\n",
    )


def test_discard_parked_drops_one_keys_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(4):
        Limited.enqueue(1, n)
    Limited.enqueue(2, 0)
    status, out, _ = run(capsys, "discard-parked", KEY1, "--url", url)
    assert (status, out) == (0, f"discarded 2 parked job(s) of {KEY1}; they will not run\n")
    assert not Limited.is_locked(1, 3)  # their uniqueness locks went too
    assert Limited.is_locked(1, 0)  # the slots' jobs are untouched
    assert len(Limited.semaphore(1).read().slots) == 2
    assert run(capsys, "discard-parked", KEY1, "--url", url) == (
        1,
        "",
        f"uniqjob: nothing parked on {KEY1!r}\n",
    )
    assert store_for(uniqjob.default_backend()).read(KEY2).slots  # another key is never touched


def test_discard_parked_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discard-parked", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: uniqjob discard-parked" in out and "uniqjob discard-parked '" in out.split("examples:")[1]
    assert main(["locks", "--concurrency", "--top", "-1"]) == 64


def test_the_command_end_to_end(tmp_path: Path) -> None:
    target = (tmp_path / "locks").as_uri()
    uniqjob.configure(target)
    for n in range(3):
        Limited.enqueue(1, n)
    result = subprocess.run(
        [sys.executable, "-m", "uniqjob", "locks", "--concurrency", "--url", target],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:4] == ["2/2", "fresh", "0", "1"]
