"""Shared fixtures: a private redis-server for the session, and every backend.

``backend`` is parametrized over Redis, file and memory, so a test that takes it
is a contract every store must keep. Redis tests get a fresh database state
(``FLUSHALL``) and a unique namespace per test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import uniqjob
from tests.redis_server import RedisServer
from uniqjob._undo import undos
from uniqjob.stores.base import Backend
from uniqjob.stores.file import FileBackend
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend


class FakeClock:
    """A settable clock for the file and memory backends: tests age leases without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    if redis_server.pid is None:  # a test stopped it
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


_namespaces = itertools.count()


@pytest.fixture
def redis_backend(redis_client: redis.Redis) -> RedisBackend:
    return RedisBackend(redis_client, namespace=f"t{next(_namespaces)}")


@pytest.fixture
def file_backend(tmp_path: Path) -> FileBackend:
    return FileBackend(tmp_path / "locks")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["redis", "file", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each backend in turn: the contract every store keeps."""
    if request.param == "redis":
        return request.getfixturevalue("redis_backend")  # type: ignore[no-any-return]
    if request.param == "file":
        return FileBackend(tmp_path / "locks")
    return MemoryBackend()


@pytest.fixture(autouse=True)
def _isolated_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test touches the user's real state directory or inherits UNIQJOB_URL."""
    monkeypatch.delenv("UNIQJOB_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    uniqjob.configure(None)
    yield
    uniqjob.configure(None)
    undos.clear()  # an undo left pending names a store of this test


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long fault soak tests (minutes)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
