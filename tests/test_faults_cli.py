"""Issue 10, items 3 and 7 on the command line: unreadable records, control characters, no tracebacks.

Before: a record of the wrong shape made ``locks`` and ``reap`` print a
traceback, one that could not be parsed made ``locks`` say "no locks held"
(exit 0) while its key stayed blocked, ``release --force`` could not clear it,
and keys were written raw to the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import uniqjob
from tests.test_cli import Store, kill_leftovers, store
from tests.test_cli import uniqjob as run_uniqjob
from tests.test_cli_locks import orphan, queued
from uniqjob.cli import main
from uniqjob.cli._common import EX_DATAERR, escape
from uniqjob.concurrency import store_for
from uniqjob.errors import BackendError, CorruptRecordError, JobNotUnique
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim, local_holder
from uniqjob.stores.file import FileBackend

__all__ = ["kill_leftovers", "store"]  # fixtures shared with test_cli

#: Retitles the terminal, then starts a line that looks like a row of its own.
EVIL = "evil\x1b]0;pwned\x07\nqueued    -    FORGED"
RAW = ("\x1b", "\x07", "\r")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def record_files(store: Store) -> set[Path]:
    backend = store.backend
    assert isinstance(backend, FileBackend)
    return set(backend.directory.glob("*.json"))


def damage(store: Store, key: str, request: pytest.FixtureRequest) -> None:
    """Give ``key`` (held by a crashed worker) a record with a field of the wrong type, by hand."""
    before = record_files(store) if store.url.startswith("file:") else set()
    orphan(store, key)
    if store.url.startswith("file:"):
        (path,) = record_files(store) - before
        record = json.loads(path.read_text())
        record["q"]["since"] = "x"
        path.write_text(json.dumps(record))
    else:
        client: redis.Redis = request.getfixturevalue("redis_client")
        assert client.hset(f"uniqjob:{{{key}}}:r", "i", "x") == 0  # the field was there
    with pytest.raises(CorruptRecordError):
        store.backend.read(key)


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[Store]:
    backend = FileBackend(tmp_path / "locks")
    yield Store((tmp_path / "locks").as_uri(), backend)
    backend.close()


def garbage(store: Store, key: str) -> Path:
    """Leave a record file for ``key`` that is not even JSON; return its path."""
    before = record_files(store)
    queued(store, key)
    (path,) = record_files(store) - before
    path.write_text("{not json")
    return path


# -- corrupt records ---------------------------------------------------------------------


@pytest.mark.slow
def test_locks_lists_a_record_of_the_wrong_shape_as_corrupt(
    store: Store, request: pytest.FixtureRequest
) -> None:
    queued(store, "good")
    damage(store, "broken", request)
    listing = run_uniqjob("locks", "--url", store.url, "--json")
    assert listing.returncode == EX_DATAERR == 65, listing.stderr  # was: a traceback
    rows = {row["key"]: row for row in map(json.loads, listing.stdout.splitlines())}
    assert rows["good"]["state"] == "queued" and rows["good"]["path"] is None
    broken = rows["broken"]
    assert broken["state"] == "corrupt" and broken["reason"] and broken["class"] is None
    assert isinstance(broken["path"], str) and broken["path"]
    assert "Traceback" not in listing.stderr
    assert f"corrupt lock record {broken['path']} of key 'broken': " in listing.stderr
    assert listing.stderr.rstrip().endswith("until removed with: uniqjob release --force broken")

    table = run_uniqjob("locks", "--url", store.url)
    assert table.returncode == 65 and "Traceback" not in table.stderr
    (line,) = [line for line in table.stdout.splitlines() if line.endswith(" broken")]
    assert line.split()[:5] == ["corrupt", "-", "-", "-", "-"] and "unreadable: " in line


def test_locks_lists_a_record_that_names_no_key_by_its_path(file_store: Store) -> None:
    path = garbage(file_store, "lost")
    listing = run_uniqjob("locks", "--url", file_store.url, "--json")
    assert listing.returncode == 65  # was: "no locks held", exit 0
    (row,) = map(json.loads, listing.stdout.splitlines())
    assert (row["key"], row["state"], row["path"]) == (None, "corrupt", str(path))
    assert "not valid JSON" in row["reason"]
    assert f"uniqjob release --force {path}" in listing.stderr
    table = run_uniqjob("locks", "--url", file_store.url)
    assert table.returncode == 65 and table.stdout.splitlines()[1].endswith(f"  {path}")


def test_locks_class_filter_still_shows_corrupt_records(file_store: Store) -> None:
    garbage(file_store, "lost")
    queued(file_store, "export-42")
    listing = run_uniqjob("locks", "--url", file_store.url, "--json", "--class", "Nope")
    assert listing.returncode == 65
    assert [json.loads(line)["state"] for line in listing.stdout.splitlines()] == ["corrupt"]


def test_reap_skips_a_corrupt_record_by_name_and_reaps_the_rest(
    store: Store, request: pytest.FixtureRequest
) -> None:
    orphan(store, "crashed")
    damage(store, "broken", request)
    reaped = run_uniqjob("reap", "--url", store.url)
    assert reaped.returncode == 65, reaped.stderr  # was: a traceback
    assert reaped.stdout.startswith("reclaimed crashed (running, pid ")
    skip, summary = reaped.stderr.splitlines()
    assert skip.startswith("uniqjob: skipping corrupt lock record ") and "of key 'broken'" in skip
    assert skip.endswith("remove it with uniqjob release --force broken")
    assert summary == "reclaimed 1 orphaned lock(s) of 1 held; skipped 1 corrupt record(s)"
    assert store.backend.read("crashed").free
    with pytest.raises(CorruptRecordError):
        store.backend.read("broken")  # left as it was


@pytest.mark.slow
def test_release_of_a_corrupt_record_needs_force_then_removes_it(
    store: Store, request: pytest.FixtureRequest
) -> None:
    damage(store, "broken", request)
    refused = run_uniqjob("release", "--url", store.url, "broken")
    assert refused.returncode == 65 and refused.stdout == ""
    assert "not releasing: corrupt lock record " in refused.stderr
    assert refused.stderr.rstrip().endswith("remove it with uniqjob release --force broken")

    forced = run_uniqjob("release", "--url", store.url, "--force", "broken")
    assert forced.returncode == 0, forced.stderr  # was: 69
    assert forced.stdout.startswith("removed corrupt record of broken: ")
    assert "(it was unreadable: " in forced.stdout
    assert store.backend.read("broken").free
    claim = RunClaim(local_holder(), lease=30)
    assert store.backend.claim("broken", "t-new", meta=QueueMeta("app.J"), run=claim) is None  # usable again
    assert run_uniqjob("locks", "--url", store.url).returncode == 0


def test_release_force_takes_the_path_of_a_record_that_names_no_key(file_store: Store) -> None:
    path = garbage(file_store, "lost")
    refused = run_uniqjob("release", "--url", file_store.url, str(path))
    assert refused.returncode == 65 and f"remove it with uniqjob release --force {path}" in refused.stderr
    assert path.exists()
    forced = run_uniqjob("release", "--url", file_store.url, "--force", str(path))
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith(f"removed corrupt record {path} (it was unreadable: not valid JSON")
    assert not path.exists()
    assert run_uniqjob("locks", "--url", file_store.url).returncode == 0
    assert file_store.backend.claim("lost", "t", meta=QueueMeta()) is None


# -- control characters ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_locks_table_escapes_control_characters_in_every_field(store: Store) -> None:
    assert store.backend.claim(EVIL, "t1", meta=QueueMeta("app\x1b[31mJob", "1\r\n2"), ttl=600) is None
    remote = RunClaim(Holder("box\x1b]0;x\x07", "node", 42, 1), lease=60)
    assert store.backend.claim("run\x1b[2J", "t2", meta=QueueMeta(), run=remote) is None
    table = run_uniqjob("locks", "--url", store.url)
    assert table.returncode == 0, table.stderr
    assert not any(c in table.stdout for c in RAW)
    _, *lines = table.stdout.splitlines()
    assert len(lines) == 2  # no forged row
    evil = next(line for line in lines if "evil" in line)
    assert evil.endswith("evil\\x1b]0;pwned\\x07\\nqueued    -    FORGED")
    assert "app\\x1b[31mJob(1\\r\\n2)" in evil
    running = next(line for line in lines if "run" in line.split()[-1])
    assert "box\\x1b]0;x\\x07:42" in running and running.endswith("run\\x1b[2J")
    # JSON stays JSON: the exact key comes back
    listing = run_uniqjob("locks", "--url", store.url, "--json")
    assert {json.loads(line)["key"] for line in listing.stdout.splitlines()} == {EVIL, "run\x1b[2J"}


@pytest.mark.slow
def test_reap_and_release_escape_the_keys_they_print(store: Store) -> None:
    orphan(store, EVIL)
    for argv in (("reap", "--dry-run"), ("reap",)):
        result = run_uniqjob(*argv, "--url", store.url)
        assert result.returncode == 0, result.stderr
        assert not any(c in result.stdout + result.stderr for c in RAW)
        assert len(result.stdout.splitlines()) == 1 and escape(EVIL) in result.stdout
    queued(store, EVIL)
    released = run_uniqjob("release", "--url", store.url, EVIL)
    assert released.returncode == 0 and released.stdout == f"released {escape(EVIL)} (queued)\n"
    missing = run_uniqjob("release", "--url", store.url, EVIL)
    assert missing.returncode == 1 and not any(c in missing.stderr for c in RAW)


@pytest.mark.slow
def test_a_corrupt_record_s_key_is_escaped_too(store: Store, request: pytest.FixtureRequest) -> None:
    damage(store, EVIL, request)
    fix = "uniqjob release --force $'evil\\x1b]0;pwned\\x07\\nqueued    -    FORGED'"  # as bash spells it
    for argv in (("locks",), ("reap",), ("release", EVIL), ("release", "--force", EVIL)):
        result = run_uniqjob(*argv, "--url", store.url)
        assert result.returncode == (0 if "--force" in argv else 65), result.stderr
        assert not any(c in result.stdout + result.stderr for c in RAW), argv
        assert fix in result.stderr or "--force" in argv
    assert result.stdout.startswith(f"removed corrupt record of {escape(EVIL)}: ")


def test_concurrency_views_escape_keys_and_hosts(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    uniqjob.configure(store.backend)
    key = "app.Export:\x1b]0;x\x07\nFORGED"
    holder = Holder("box\x1b[2J", "node", 42, 1)
    store_for(store.backend).acquire(
        key, "t", limit=1, lease=600, running=True, holder=holder, park=None,
        job_class="app.Export", args="", caller=local_holder(),
    )  # fmt: skip
    status, out, _ = run(capsys, "locks", "--concurrency", "--url", store.url)
    assert status == 0 and not any(c in out for c in RAW)
    assert len(out.splitlines()) == 3 and out.splitlines()[1].endswith(escape(key))
    status, out, err = run(capsys, "release", "--url", store.url, key)
    assert status == 1 and "pid 42 on box\\x1b[2J" in err
    assert not any(c in out + err for c in RAW)


# -- never a traceback --------------------------------------------------------------------


class Broken(FileBackend):
    """A store whose listing and reads fail, as a bug in a client or a store would make them."""

    failure: Exception = KeyError("boom")

    def read(self, key: str) -> LockState:
        raise self.failure

    def scan(self) -> Iterator[str]:
        raise self.failure


FAILURES = [
    pytest.param(KeyError("boom"), 70, "internal error in `uniqjob {cmd}`: KeyError: 'boom'", id="bug"),
    pytest.param(
        TypeError("bad\x1b]0;x\x07"),
        70,
        "internal error in `uniqjob {cmd}`: TypeError: bad\\x1b]0;x\\x07",
        id="raw",
    ),
    pytest.param(
        BackendError("down\nagain", "file"), 69, "lock store unavailable: file: down\\nagain", id="store"
    ),
    pytest.param(JobNotUnique("k"), 70, "job 'k' is already locked", id="uniqjob-error"),
]


@pytest.mark.parametrize(("failure", "status", "line"), FAILURES)
@pytest.mark.parametrize("cmd", ["locks", "reap", "release"])
def test_any_failure_in_a_command_is_one_line_and_its_exit_status(
    failure: Exception, status: int, line: str, cmd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = Broken("/nonexistent/locks")
    backend.failure = failure
    uniqjob.configure(backend)
    got, out, err = run(capsys, *([cmd, "k"] if cmd == "release" else [cmd]))
    assert (got, out, err) == (status, "", f"uniqjob: {line.format(cmd=cmd)}\n")


@pytest.mark.parametrize("cmd", ["locks", "reap"])
def test_a_corrupt_record_error_from_a_listing_exits_65(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    backend = Broken("/nonexistent/locks")
    backend.failure = CorruptRecordError("/x", "torn", key="k")
    uniqjob.configure(backend)
    got, out, err = run(capsys, cmd)
    assert (got, out) == (65, "")
    assert (
        err
        == "uniqjob: file: unreadable lock record /x of key 'k': torn; it blocks its key until removed with: "
        "uniqjob release --force k\n"
    )
