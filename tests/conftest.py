"""Shared fixtures: a private redis-server for the session, and every store.

:data:`STORES` is the one list of stores: every store-parametrized fixture
(``backend`` here, the contract suites' own) is built from it, so adding a
store to the tests is one entry. ``backend`` is parametrized over all of them,
so a test that takes it is a contract every store must keep. Redis tests get a
fresh database state (``FLUSHALL``) and a unique namespace per test.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import uniqjob
from tests.redis_server import RedisServer
from tests.support import dictstore
from uniqjob import stores
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


Clock = Callable[[], float]


def _redis(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Backend:
    return request.getfixturevalue("redis_backend")  # type: ignore[no-any-return]


def _redis_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    request.getfixturevalue("redis_client")  # flushes the database
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@dataclass(frozen=True)
class StoreKind:
    """How the tests make one store."""

    #: A new store for a test: on ``clock`` if it takes one (Redis keeps the server's).
    make: Callable[[pytest.FixtureRequest, Path, Clock], Backend]
    #: Whether it follows the clock it is given (else a test waits its leases out).
    fake_clock: bool = True
    #: A URL that other processes open to share its locks; None for a store of one process.
    url: Callable[[pytest.FixtureRequest, Path], str] | None = None


#: The one list of stores the tests run against: every store-parametrized fixture is built from it.
STORES: dict[str, StoreKind] = {
    "redis": StoreKind(_redis, fake_clock=False, url=_redis_url),
    "file": StoreKind(
        lambda request, tmp_path, clock: FileBackend(tmp_path / "locks", clock=clock),
        url=lambda request, tmp_path: (tmp_path / "locks").as_uri(),
    ),
    "memory": StoreKind(lambda request, tmp_path, clock: MemoryBackend(clock=clock)),
    "dict": StoreKind(lambda request, tmp_path, clock: dictstore.DictBackend(clock=clock)),  # tests/support
}

#: The stores other processes can share through a URL (the tests that spawn processes or run the CLI).
SHARED_STORES = [name for name, kind in STORES.items() if kind.url is not None]


def make_store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock = time.time) -> Backend:
    """A new store of the kind ``request.param`` names."""
    return STORES[request.param].make(request, tmp_path, clock)


def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a new store of the shared kind ``request.param`` names."""
    url = STORES[request.param].url
    assert url is not None, f"{request.param} is not a store other processes can open"
    return url(request, tmp_path)


@pytest.fixture(params=list(STORES))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store in turn: the contract every store keeps."""
    return make_store(request, tmp_path)


@pytest.fixture
def dict_scheme() -> Iterator[str]:
    """The test store registered under ``dict://`` for one test (the built-in schemes stay as they are)."""
    stores.register("dict", dictstore.from_url)
    yield "dict"
    stores.unregister("dict")


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
