"""Issue 10, items 5 and 6: inputs the README promises to key (or refuse by name), and malformed URLs.

Each of these crashed before: a big int or a cycle with ValueError or
RecursionError, a bad URL with a traceback or a silently wrong database.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError, UniqueJob, UniqueKeyError
from uniqjob.cli import main
from uniqjob.config import backend_from_url
from uniqjob.keys import MAX_DEPTH, KeyPlan, canonical, make_key
from uniqjob.locks import QueueMeta
from uniqjob.stores.file import FileBackend
from uniqjob.stores.redis import REDIS_URL_OPTIONS, RedisBackend, redis_client_from_url


class Job(UniqueJob):
    def perform(self, a: Any) -> None:
        pass


@pytest.fixture
def int_digits_limit() -> Iterator[None]:
    """Restore the process's int-to-text limit after a test that lowers it."""
    before = sys.get_int_max_str_digits()
    yield
    sys.set_int_max_str_digits(before)


def nested(depth: int) -> list[Any]:
    """A list ``depth`` lists deep: [[[...]]]."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


# -- keys: big ints ---------------------------------------------------------------------


def test_an_int_past_the_int_to_text_limit_is_keyed() -> None:
    big = 10**5000 + 12345
    key = Job.lock_key(big)  # was: ValueError, Exceeds the limit (4300 digits)
    assert key == Job.lock_key(10**5000 + 12345) == make_key(f"{__name__}.Job", {"a": big})
    assert len({key, Job.lock_key(big + 1), Job.lock_key(-big), Job.lock_key(hex(big))}) == 4
    assert Job.lock_key([big, {big: big}]) == Job.lock_key([big, {big: big}])


def test_an_int_within_the_default_limit_keeps_its_key_whatever_this_process_allows(
    int_digits_limit: None,
) -> None:
    largest = 10**4300 - 1  # 4300 digits: the longest int the default limit converts
    before = canonical([largest, -largest])
    sys.set_int_max_str_digits(640)  # the lowest a process may set
    assert canonical([largest, -largest]) == before  # was: ValueError
    sys.set_int_max_str_digits(0)
    assert before == b"l2:i%d;i%d;" % (largest, -largest)


@given(st.integers(min_value=10**4295, max_value=10**4305), st.integers(-3, 3), st.booleans())
def test_big_ints_are_one_key_each_and_the_planned_key_agrees(value: int, step: int, negative: bool) -> None:
    a = -value if negative else value
    b = a + step
    assert (canonical(a) == canonical(b)) == (a == b)
    assert KeyPlan(["x"]).key("job", [a]) == make_key("job", {"x": a})


# -- keys: cycles and depth ------------------------------------------------------------


def test_a_list_that_contains_itself_is_refused_by_name() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(UniqueKeyError, match=r"^a\[1\]: this list contains itself \(it is a again\)"):
        Job.lock_key(loop)  # was: RecursionError


def test_a_cycle_through_other_containers_is_refused_by_name() -> None:
    inner: dict[str, Any] = {}
    payload = {"user": [7, (inner,)]}
    inner["back"] = payload
    with pytest.raises(UniqueKeyError) as caught:
        canonical(payload, "payload")
    assert caught.value.path == 'payload["user"][1][0]["back"]'
    assert "contains itself (it is payload again)" in caught.value.reason


def test_one_value_in_two_places_is_no_cycle() -> None:
    shared = [1, 2]
    assert canonical([shared, shared, {"a": shared}]) == canonical([[1, 2], [1, 2], {"a": [1, 2]}])


def test_nesting_up_to_the_limit_is_keyed_and_deeper_is_refused_by_name() -> None:
    assert canonical(nested(MAX_DEPTH)).startswith(b"l1:" * (MAX_DEPTH - 1) + b"l0:")
    with pytest.raises(UniqueKeyError, match=f"nests deeper than {MAX_DEPTH} containers") as caught:
        Job.lock_key(nested(MAX_DEPTH + 1))
    assert caught.value.path == "a" + "[0]" * MAX_DEPTH
    deep_dict: dict[str, Any] = {}
    at = deep_dict
    for _ in range(MAX_DEPTH):
        at["x"] = at = {}
    with pytest.raises(UniqueKeyError, match="nests deeper"):
        canonical(deep_dict)


def test_a_list_nested_100000_deep_is_refused_at_once() -> None:
    deep = nested(100_000)
    started = time.perf_counter()
    with pytest.raises(UniqueKeyError, match=f"nests deeper than {MAX_DEPTH}"):
        Job.lock_key(deep)  # was: RecursionError
    assert time.perf_counter() - started < 0.5


# -- keys: timedelta ------------------------------------------------------------------------


def test_a_timedelta_is_keyed_by_its_value_and_type() -> None:
    hour = dt.timedelta(hours=1)
    assert Job.lock_key(hour) == Job.lock_key(dt.timedelta(minutes=60)) == Job.lock_key(dt.timedelta(0, 3600))
    others = [dt.timedelta(hours=-1), dt.timedelta(hours=1, microseconds=1), 3600, 3600.0, "1:00:00"]
    assert len({Job.lock_key(hour)} | {Job.lock_key(v) for v in others}) == 1 + len(others)
    assert canonical(dt.timedelta(days=-1, seconds=5, microseconds=7)) == b"t-86394999993;"


@given(st.timedeltas(), st.timedeltas())
def test_equal_timedeltas_are_one_key(a: dt.timedelta, b: dt.timedelta) -> None:
    assert (canonical(a) == canonical(b)) == (a == b)


def test_a_run_refuses_a_cycle_and_deep_nesting_by_name_and_runs_a_timedelta() -> None:
    class Once(UniqueJob):
        unique_backend = "memory://"

        def perform(self, a: Any) -> str:
            return "ran"

    loop: list[Any] = []
    loop.append(loop)
    for value, message in ((loop, "contains itself"), (nested(100_000), "nests deeper")):
        with pytest.raises(UniqueKeyError, match=message):
            Once.run(value)
    assert Once.run(dt.timedelta(minutes=5)) == "ran"


# -- URLs --------------------------------------------------------------------------------------

BAD_URLS = [
    pytest.param("redis://[::1/0", "the host is not a well-formed [IPv6] address", id="ipv6-bracket"),
    pytest.param("file:///tmp/locks%00x", "the path holds a NUL byte (%00)", id="file-nul"),
    pytest.param("unix:///tmp/redis%00.sock", "the socket path holds a NUL byte", id="unix-nul"),
    pytest.param(
        "redis://localhost/0?foo=bar", "unknown option 'foo' (supported: db, timeout,", id="unknown"
    ),
    pytest.param("file:///tmp/locks?foo=bar", "unknown option 'foo' (supported: timeout)", id="file-unknown"),
    pytest.param("memory://?foo=bar", "unknown option 'foo' (supported: none)", id="memory-unknown"),
    pytest.param("unix://", "no socket path: use unix:///path/to/redis.sock", id="unix-no-path"),
    pytest.param("unix://redis.sock", "names a socket by its absolute path", id="unix-relative"),
    pytest.param("redis://host/notadb", "the path must be a database number, e.g. /0, got 'notadb'", id="db"),
    pytest.param("redis://host/0?db=1", "the database is given twice", id="db-twice"),
    pytest.param("redis://host?db=-1", "option 'db' must be a database number", id="db-negative"),
    pytest.param("redis://host:99999/0", "the port must be a number 1-65535", id="port-range"),
    pytest.param("redis://host:0/0", "port 0 is not a port", id="port-zero"),
    pytest.param("redis://host/0?timeout=soon", "option 'timeout' must be a number of seconds > 0", id="t"),
    pytest.param("redis://host/0?timeout=", "option 'timeout' needs a value", id="no-value"),
    pytest.param("redis://host/0?db=1&db=2", "", id="option-twice"),
    pytest.param(
        "redis://host/0?ssl_cert_reqs=none", "option 'ssl_cert_reqs' needs a rediss:// URL", id="ssl"
    ),
    pytest.param("redis://host/0#x", "'#' starts a URL fragment", id="fragment"),
    pytest.param("file:///", "refusing / as a lock store", id="file-root"),
    pytest.param("file:///tmp/..//", "refusing / as a lock store", id="file-root-dots"),
    pytest.param("file:///tmp/x?timeout=0", "option 'timeout' must be a number of seconds > 0", id="file-t"),
    pytest.param("memory://somewhere", "memory:// takes no host or path", id="memory-host"),
]


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_a_malformed_url_is_a_configuration_error_naming_the_problem(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url)
    assert str(caught.value).startswith("bad ") and f" URL {url!r}: " in str(caught.value)
    assert message in str(caught.value)


def test_an_option_given_twice_is_named() -> None:
    with pytest.raises(ConfigurationError, match="option 'db' is given twice"):
        redis_client_from_url("redis://host?db=1&db=2", timeout=1)


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_the_command_exits_78_on_a_malformed_url(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["locks", "--url", url]) == 78
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("uniqjob: configuration error: bad ") and message in err


def test_a_malformed_url_gives_no_traceback_from_the_real_command() -> None:
    from tests.test_cli import uniqjob as run_uniqjob

    result = run_uniqjob("locks", "--url", "redis://[::1/0")
    assert result.returncode == 78  # was: a traceback, exit 1
    assert result.stderr == (
        "uniqjob: configuration error: bad Redis URL 'redis://[::1/0': "
        "the host is not a well-formed [IPv6] address (a bracket is missing)\n"
    )


def test_a_password_never_appears_in_a_url_error() -> None:
    for url in ("redis://app:hunter2@host/0?nope=1", "redis://host/0?password=hunter2&nope=1"):
        with pytest.raises(ConfigurationError, match="unknown option 'nope'") as caught:
            backend_from_url(url)
        assert "hunter2" not in str(caught.value) and "***" in str(caught.value)


def test_a_bad_uniqjob_url_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UNIQJOB_URL", "redis://localhost/0?foo=bar")
    with pytest.raises(ConfigurationError, match=r"^the UNIQJOB_URL environment variable: bad Redis URL"):
        uniqjob.default_backend()
    assert main(["locks"]) == 78
    assert "UNIQJOB_URL" in capsys.readouterr().err


def test_the_supported_redis_options_are_applied() -> None:
    client = redis_client_from_url(
        "redis://app:s%40cret@cache.internal:6380/4?socket_timeout=1.5&client_name=reports"
        "&health_check_interval=30",
        timeout=7,
    )
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.Connection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.internal", 6380, 4)
    assert (kwargs["username"], kwargs["password"], kwargs["client_name"]) == ("app", "s@cret", "reports")
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (1.5, 7)
    assert kwargs["health_check_interval"] == 30
    both = redis_client_from_url("redis://h?timeout=2&socket_connect_timeout=0.5", timeout=7)
    kwargs = both.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs.get("db", 0)) == (2, 0.5, 0)
    tls = redis_client_from_url("rediss://h/0?ssl_cert_reqs=none&ssl_check_hostname=false", timeout=1)
    assert tls.connection_pool.connection_class is redis.SSLConnection
    kwargs = tls.connection_pool.connection_kwargs
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("none", False)
    assert set(REDIS_URL_OPTIONS) >= {"db", "timeout", "password", "ssl_ca_certs"}


def test_url_options_reach_a_real_server(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    client = redis_client_from_url(
        f"{redis_server.url.rsplit('/', 1)[0]}/3?client_name=uniqjob-test", timeout=2
    )
    try:
        assert client.client_getname() == "uniqjob-test"
        assert client.client_info()["db"] == 3
    finally:
        client.close()
    backend = backend_from_url(f"unix://{redis_server.socket_path}?db=5")
    assert isinstance(backend, RedisBackend)
    try:
        assert backend.claim("k", "t", meta=QueueMeta("app.J")) is None
        on_db5 = redis.Redis(unix_socket_path=redis_server.socket_path, db=5)
        assert on_db5.keys("uniqjob:*") and not redis_client.keys("uniqjob:*")
        on_db5.flushdb()
        on_db5.close()
    finally:
        backend.close()


def test_a_file_url_may_set_the_lock_wait(tmp_path: Path) -> None:
    backend = backend_from_url(f"{tmp_path.as_uri()}/locks?timeout=3")
    assert isinstance(backend, FileBackend) and backend.timeout == 3
