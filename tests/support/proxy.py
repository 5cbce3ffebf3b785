"""A loopback TCP proxy that tests steer, to stage store faults between a client and a real server.

``FaultProxy(target)`` listens on a free port of 127.0.0.1 and forwards every
connection to ``target`` (host, port), bytes unchanged, until told otherwise:

- ``pause()``: nothing is forwarded either way; connections stay open (new ones
  are accepted and connected upstream, but their bytes wait). ``resume()``
  forwards again, withheld replies first.
- ``hold_replies()``: requests still reach the server, so a command is applied,
  but its reply is withheld: lost if ``drop()`` follows, late if ``resume()``.
- ``delay(seconds)``: each chunk of reply is delivered ``seconds`` late
  (``delay(0)`` ends it).
- ``drop()``: every open connection is reset (RST, both sides); new connections
  are accepted as before.
- ``close()`` (or leaving the ``with`` block): stop listening and reset everything.

``url`` is ``redis://127.0.0.1:PORT/0``, for a client that should go through it.
Only the standard library: a thread accepts, two threads pump each connection.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Self

__all__ = ["FaultProxy"]

_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` abruptly: SO_LINGER 0 sends RST rather than a polite FIN.

    The kernel closes a socket only once no call is blocked on it: ``SHUT_RD``
    first wakes a thread waiting in ``recv`` (sending nothing), so the reset
    goes out as soon as that thread lets go (see ``_Link.close``).
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream twin, with the replies withheld from the client."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.held: list[bytes] = []
        self.send_lock = threading.Lock()  # the pump and a flush never interleave replies
        self.pumps: list[threading.Thread] = []
        self.closed = False

    def close(self, *, wait: bool = True) -> None:
        """Reset both sides; once the pumps have let go of the sockets, the resets are on the wire.

        ``wait``: return only then (a pump closing its own link does not wait for its twin).
        """
        self.closed = True
        _reset(self.client)
        _reset(self.server)
        if wait:
            for pump in self.pumps:
                if pump.ident is not None:  # (dropped as it was being set up: not started yet)
                    pump.join(5)


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``target``, with faults switched on and off by the test."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._cond = threading.Condition()
        self._paused = False
        self._holding = False
        self._delay = 0.0
        self._links: list[_Link] = []
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        """A Redis URL that reaches ``target`` through this proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def connections(self) -> int:
        """How many client connections are open through the proxy now."""
        with self._cond:
            return sum(1 for link in self._links if not link.closed)

    # -- the faults ------------------------------------------------------------------

    def pause(self) -> None:
        """Stop forwarding both ways; keep every connection open."""
        with self._cond:
            self._paused = True

    def hold_replies(self) -> None:
        """Forward requests, withhold replies (the server applies a command; its client hears nothing)."""
        with self._cond:
            self._holding = True

    def delay(self, seconds: float) -> None:
        """Deliver each reply chunk ``seconds`` late from now on (0: on time again)."""
        with self._cond:
            self._delay = seconds

    def resume(self) -> None:
        """Forward again both ways, withheld replies first, in order."""
        with self._cond:
            self._paused = self._holding = False
            links = list(self._links)
            self._cond.notify_all()
        for link in links:
            self._flush(link)

    def drop(self) -> None:
        """Reset every open connection (withheld replies are lost); later connections are served."""
        with self._cond:
            links, self._links = self._links, []
            self._cond.notify_all()
        for link in links:
            link.close()

    def close(self) -> None:
        """Stop listening and reset every connection."""
        with self._cond:
            self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
        _reset(self._listener)
        self.drop()
        self._acceptor.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the plumbing ----------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)  # the target refuses: so does the proxy
                continue
            link = _Link(client, server)
            with self._cond:
                if self._closed:
                    link.close()
                    return
                self._links.append(link)
            link.pumps = [
                threading.Thread(target=self._pump, args=(link, src, upstream), daemon=True)
                for src, upstream in ((client, True), (server, False))
            ]
            for pump in link.pumps:
                pump.start()

    def _pump(self, link: _Link, src: socket.socket, upstream: bool) -> None:
        """Copy ``src`` to the other side of ``link`` until either end closes, obeying the faults."""
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                if upstream:
                    if not self._wait_unpaused(link):
                        break  # dropped while paused: the request never reaches the server
                    link.server.sendall(data)
                else:
                    self._reply(link, data)
        except OSError:
            pass
        link.close(wait=False)

    def _wait_unpaused(self, link: _Link) -> bool:
        """Wait while paused; False if ``link`` was dropped meanwhile (its request is lost)."""
        with self._cond:
            while self._paused and not link.closed:
                self._cond.wait(0.05)
            return not link.closed

    def _reply(self, link: _Link, data: bytes) -> None:
        with self._cond:
            while self._paused and not self._holding and not link.closed:
                self._cond.wait(0.05)
            if self._holding or self._paused:
                link.held.append(data)
                return
            delay = self._delay
        if delay > 0:
            time.sleep(delay)
        self._flush(link, data)

    def _flush(self, link: _Link, data: bytes = b"") -> None:
        """Send what was withheld from ``link``'s client, then ``data``."""
        with link.send_lock:
            with self._cond:
                held, link.held = link.held, []
            payload = b"".join(held) + data
            if payload and not link.closed:
                with contextlib.suppress(OSError):
                    link.client.sendall(payload)
