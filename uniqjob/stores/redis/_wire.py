"""How the Redis stores call their Lua scripts: through the client's public API, nothing of its own.

:class:`Wire` runs a script by ``client.evalsha(sha, ...)``, and if the server
lost it (a restart, ``SCRIPT FLUSH``: a ``NOSCRIPT`` reply) loads it with
``client.script_load`` and sends it again. A batch of calls, and a grant with
``WAIT`` behind it (replica acknowledgement, ``_acks``), go through
``client.pipeline(transaction=False)``: one connection, one round trip.
The client's own pool, retry policy and health checks do the rest, for every
kind of client the stores take (redis-py's or valkey-py's, one server, a
Sentinel master, a cluster), on RESP2 or RESP3, ``decode_responses`` on or off.

Replies are made alike in one place, :func:`plain`: a string comes as ``str``
whatever the client's ``decode_responses``, an integer as ``int``, nil as
None, an array as a list of those. (Our scripts never switch to RESP3 replies
themselves, so RESP3 brings no other type: no map, double or boolean.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from redis.commands.core import Script

from ._client import _classes, is_cluster

__all__ = ["Wire", "is_noscript", "node_client", "plain", "text"]


def text(value: Any) -> str:
    """A string reply as ``str``: bytes (``decode_responses`` off) decoded as UTF-8."""
    return value.decode("utf-8", "surrogateescape") if type(value) is bytes else str(value)


def plain(reply: Any) -> Any:
    """A script's reply with every string a ``str`` (see the module's docstring); errors left as they are."""
    kind = type(reply)
    if kind is bytes:
        return reply.decode("utf-8", "surrogateescape")
    if kind is list:
        return [plain(item) for item in reply]
    return reply


def is_noscript(exc: BaseException) -> bool:
    """The server does not know the script (restart, SCRIPT FLUSH), whichever client says so.

    redis-py's ``NoScriptError``, a fork's of the same name (valkey-py's), or the
    bare error reply (a client that raises every reply as one class).
    """
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


def node_client(node: Any) -> Any:
    """One cluster node's client: redis-py calls it ``redis_connection``, valkey-py ``valkey_connection``."""
    client = getattr(node, "redis_connection", None) or getattr(node, "valkey_connection", None)
    if client is None:
        raise AttributeError(f"cluster node {getattr(node, 'name', node)!r} has no client")
    return client


class Wire:
    """Calls scripts on ``client`` (see the module's docstring); every reply through :func:`plain`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def call(self, script: Script, numkeys: int, items: Sequence[Any]) -> Any:
        """Run ``script`` with ``items``, its ``numkeys`` keys and then its arguments; its reply."""
        client = self.client
        try:
            return plain(client.evalsha(script.sha, numkeys, *items))
        except Exception as exc:
            if not is_noscript(exc):
                raise
        script.sha = client.script_load(script.script)
        return plain(client.evalsha(script.sha, numkeys, *items))

    def many(self, script: Script, numkeys: int, batch: Sequence[Sequence[Any]]) -> list[Any]:
        """Run ``script`` once for each entry of ``batch`` (its keys, then its arguments), all sent
        together (:func:`piped`); the replies in order, each through :func:`plain`, errors in place."""
        if not batch:
            return []
        return [plain(reply) for reply in piped(self.client, script, numkeys, batch)]

    def acked(
        self, script: Script, numkeys: int, items: Sequence[Any], wait: tuple[int, int]
    ) -> tuple[Any, int | Exception]:
        """Run ``script`` as :meth:`call` does, then ``WAIT replicas timeout_ms`` (``wait``) on the same
        connection, both in one pipeline; the script's reply and how many replicas acknowledged
        (or the error ``WAIT`` replied: a master that became a replica, say).

        ``WAIT`` counts the writes of its own connection, so it goes where the script went:
        one connection of the client's pool, or on a cluster client the connection to the
        primary that owns the first key's slot (its slot map read again and the call sent
        again once, should that node redirect it).
        """

        def waited(client: Any, asking: bool = False) -> tuple[Any, int | Exception]:
            return judged(*piped(client, script, numkeys, [items], "WAIT", *wait, asking=asking))

        cluster = self.client
        if not is_cluster(cluster):
            return waited(cluster)
        node = cluster.get_node_from_key(items[0])
        try:
            return waited(node_client(node))
        except _classes("AskError") as exc:  # MovedError too: the slot map this client holds is out of date
            if isinstance(exc, _classes("MovedError")):
                cluster.nodes_manager.initialize()
                return waited(node_client(cluster.get_node_from_key(items[0])))
            # ASK: the slot is moving and the key is not on this node: ask the one it names (ASKING first)
            target = cluster.get_node(host=exc.host, port=exc.port)  # type: ignore[attr-defined]
            if target is None:
                raise
            return waited(node_client(target), asking=True)
        except _classes("ConnectionError") + _classes("TimeoutError") + (OSError,):
            # a node that cannot be reached (a master killed): the next call finds the slot's new owner
            with contextlib.suppress(Exception):
                cluster.nodes_manager.initialize()
            raise

    def connected_replicas(self, name: Any) -> int | None:
        """How many replicas the primary that holds ``name`` has connected (``INFO replication``).

        On one server (or a Sentinel master) the client's own; on a cluster, that of the
        node that owns ``name``'s slot. None if it cannot be told: this never raises.
        """
        try:
            client = self.client
            if is_cluster(client):
                client = node_client(client.get_node_from_key(name))
            return int(client.info("replication")["connected_slaves"])
        except Exception:  # only for a message: the call fails with its own error
            return None


def piped(
    client: Any,
    script: Script,
    numkeys: int,
    batch: Sequence[Sequence[Any]],
    *tail: Any,
    asking: bool = False,
) -> list[Any]:
    """``script`` once per entry of ``batch``, then the command ``tail`` if any, in one pipeline of
    ``client`` (``ASKING`` first if ``asking``): one connection, one round trip.

    The replies come in order, an error reply in its place (returned, not raised); a
    failure to talk to the server is raised. A cluster client's pipeline sends each call
    to the node of its keys' slot. If the server lost the script, it is loaded and all
    is sent again, once.
    """
    for attempt in (0, 1):
        pipe = client.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        for items in batch:  # (a cluster pipeline refuses its evalsha method, not the command)
            pipe.execute_command("EVALSHA", script.sha, numkeys, *items)
        if tail:
            pipe.execute_command(*tail)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        if attempt or not any(isinstance(r, Exception) and is_noscript(r) for r in replies):
            return replies[1:] if asking else replies
        script.sha = client.script_load(script.script)
    raise AssertionError("unreachable")  # pragma: no cover


def judged(reply: Any, acked: Any) -> tuple[Any, int | Exception]:
    """A script's reply (raised if an error) and ``WAIT``'s count (an error reply kept as it is).

    An error reply to the script is raised once both replies are read.
    """
    if isinstance(reply, Exception):
        raise reply
    if not isinstance(acked, Exception) and type(acked) is not int:
        raise _classes("InvalidResponse")[0](f"WAIT replied {acked!r}")
    return plain(reply), acked
