"""Review of issue 24: ``uniqjob run --overlap buffer-one`` when the run that waits is stopped or killed.

Real ``uniqjob run`` processes on the session's redis-server, as in tests/test_cli_overlap.py.
Each was a bug the review found (issue 24), fixed since.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.test_cli import finish, kill_leftovers, uniqjob, wait_for
from tests.test_cli_overlap import lines, run_on, url

__all__ = ["kill_leftovers", "url"]  # fixtures

pytestmark = pytest.mark.slow


def pending_run(url: str) -> str | None:
    listed = uniqjob("locks", "--url", url, "--json").stdout.strip()
    if not listed:
        return None
    row = json.loads(listed.splitlines()[0])
    return row.get("pending_run") if isinstance(row, dict) else None


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_run_coalesced_into_a_waiter_that_dies_still_runs(
    url: str, tmp_path: Path, how: signal.Signals
) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    holder = run_on("host-a", url, log, go)
    wait_for(lambda: len(lines(log)) == 1, what="the holder to start")
    waiter = run_on("host-b", url, log, go, "--overlap", "buffer-one", "--lease", "2")
    wait_for(lambda: (pending_run(url) or "").endswith(f":{waiter.pid}"), what="the waiter to wait")
    later = run_on("host-b", url, log, go, "--overlap", "buffer-one")  # the last trigger
    status, _, err = finish(later)
    assert status == 0 and "another run waits to run after" in err, err
    waiter.send_signal(how)  # the run it coalesced into is stopped by its operator, or dies
    finish(waiter)
    go.touch()
    assert finish(holder)[0] == 0
    # a run after the holder's, for the last trigger: within the waiter's place's lease at most
    wait_for(lambda: sum(line.startswith("start") for line in lines(log)) == 2, timeout=8, what="a run")


def test_buffer_one_takes_over_from_a_holder_killed_on_its_own_host_at_once(url: str, tmp_path: Path) -> None:
    log, go = tmp_path / "log", tmp_path / "go"
    holder = run_on("host-a", url, log, go, "--lease", "60")
    wait_for(lambda: len(lines(log)) == 1, what="the holder to start")
    waiter = run_on("host-a", url, log, go, "--overlap", "buffer-one")
    wait_for(lambda: (pending_run(url) or "").endswith(f":{waiter.pid}"), what="the waiter to wait")
    holder.send_signal(signal.SIGKILL)  # its command dies with it (PR_SET_PDEATHSIG)
    finish(holder)
    go.touch()
    wait_for(lambda: len(lines(log)) >= 3, timeout=8, what="the waiter's run, well within the 60 s lease")
    assert finish(waiter)[0] == 0
