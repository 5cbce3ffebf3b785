"""Messages name the problem and the fix: units on durations, credentials, where a URL came from."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import BackendError, ConfigurationError, JobNotUnique, UniqueJob
from uniqjob.errors import StoreRefusedURLError, holder_text
from uniqjob.stores.redis._client import NEEDS_PASSWORD, NO_SUCH_DB, WRONG_PASSWORD

UNIQJOB = [sys.executable, "-m", "uniqjob"]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [*UNIQJOB, *args], capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env}
    )


def test_durations_in_a_holders_facts_carry_their_unit() -> None:
    facts = {"state": "queued", "since": 0.005, "job_id": "abc"}
    assert holder_text(facts) == "queued, taken 0.005s ago, job id abc"
    running = {"state": "running", "since": 3.25, "host": "web-1", "pid": 42, "running_for": 3.1}
    assert holder_text(running) == "running as pid 42 on web-1 for 3.100s, taken 3.250s ago"
    assert holder_text({"state": "queued", "odd": 1}) == "queued, odd=1"
    assert holder_text({}) == "" and str(JobNotUnique("k")) == "job 'k' is already locked"
    error = JobNotUnique("k", facts)
    assert str(error) == "job 'k' is already locked (queued, taken 0.005s ago, job id abc)"


class Slow(UniqueJob):
    unique_backend = "memory://"

    def perform(self, n: int) -> int:
        return n


def test_a_dropped_duplicate_is_logged_as_a_sentence(caplog: pytest.LogCaptureFixture) -> None:
    lock = Slow.lock(1)
    assert lock.acquire()
    try:
        with caplog.at_level(logging.INFO, logger="uniqjob"):
            assert Slow.run(1) is None
    finally:
        lock.release()
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "is already locked (queued, taken " in line and "s ago)" in line and "{" not in line


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    """A redis-server that needs the password ``pw``."""
    server = RedisServer(extra_args=("--requirepass", "pw"))
    server.start()
    yield server
    server.close()


def _backend(url: str) -> Any:
    return uniqjob.backend_from_url(url)


def test_a_server_that_needs_a_password_says_to_put_it_in_the_url(guarded: RedisServer) -> None:
    with pytest.raises(StoreRefusedURLError) as caught:
        _backend(guarded.url).read("k")
    assert NEEDS_PASSWORD in str(caught.value) and "HELLO" not in str(caught.value)
    assert isinstance(caught.value, BackendError) and isinstance(caught.value, ConfigurationError)
    with pytest.raises(StoreRefusedURLError, match="refused the user name or password"):
        _backend(guarded.url.replace("redis://", "redis://:wrong@")).read("k")
    assert _backend(guarded.url.replace("redis://", "redis://:pw@")).read("k").free


def test_the_command_line_exits_78_naming_the_fix_for_credentials(guarded: RedisServer) -> None:
    result = cli("locks", "--url", guarded.url)
    assert result.returncode == 78, result.stderr
    assert NEEDS_PASSWORD in result.stderr
    wrong = cli("locks", "--url", guarded.url.replace("redis://", "redis://:nope@"))
    assert wrong.returncode == 78 and WRONG_PASSWORD in wrong.stderr and "nope" not in wrong.stderr


def test_a_database_the_server_lacks_is_a_configuration_error(redis_server: RedisServer) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/99999"
    result = cli("locks", "--url", url)
    assert result.returncode == 78, result.stderr
    assert NO_SUCH_DB in result.stderr


@pytest.mark.slow
def test_an_error_from_the_environments_store_names_the_variable(guarded: RedisServer) -> None:
    masked = guarded.url.replace("redis://", "redis://:nope@")
    result = cli("locks", UNIQJOB_URL=masked)
    assert result.returncode == 78
    assert "(the store of UNIQJOB_URL='redis://:***@" in result.stderr and "nope" not in result.stderr
    unreachable = cli("locks", UNIQJOB_URL="redis://127.0.0.1:1/0")
    assert (
        unreachable.returncode == 69
        and "(the store of UNIQJOB_URL='redis://127.0.0.1:1/0')" in unreachable.stderr
    )
    malformed = cli("locks", UNIQJOB_URL="redis://x:y:z")
    assert malformed.returncode == 78
    assert malformed.stderr.count("UNIQJOB_URL") == 1  # said once: the variable names itself already
    given = cli("locks", "--url", "redis://127.0.0.1:1/0", UNIQJOB_URL="redis://elsewhere:1/0")
    assert "UNIQJOB_URL" not in given.stderr  # --url was the store: the variable played no part
