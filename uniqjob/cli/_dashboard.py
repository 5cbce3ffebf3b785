"""``uniqjob dashboard``: serve the web dashboard (:mod:`uniqjob.dashboard`) with uvicorn.

The socket is bound before the server starts, so ``--port 0`` picks a free
port and the first line on stderr names the address actually served.
"""

from __future__ import annotations

import argparse
import socket
import sys

from ..errors import ConfigurationError
from ._common import EX_OK, SubParsers, UsageError, add_url_option, open_backend, whole_number

__all__ = ["add_dashboard_parser"]

_EPILOG = """\
The first line on stderr is `serving on http://HOST:PORT/`. Pages: / (parked
jobs, held locks) and /locks (concurrency keys, busiest first; held locks,
orphans first), each refreshed every few seconds. Release and Discard parked
act on one key after a confirmation; --read-only leaves them out and refuses
their requests. Bind only to an address you trust, or mount the application
(uniqjob.dashboard.create_app) inside your own behind its authentication:
the dashboard has no login of its own.

Needs the dashboard extra: pip install 'uniqjob[dashboard]'.

examples:
  uniqjob dashboard --url redis://localhost:6379/0
  uniqjob dashboard --read-only --host 0.0.0.0 --port 8080
"""


def add_dashboard_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob dashboard``."""
    parser = subparsers.add_parser(
        "dashboard",
        help="serve the web dashboard",
        description="Serve a web dashboard of the store's locks, concurrency keys and parked jobs.",
        epilog=_EPILOG,
    )
    add_url_option(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=whole_number(0, 65535, "a port number 0-65535"),
        default=8765,
        help="port to listen on; 0 picks a free one",
    )
    parser.add_argument("--read-only", action="store_true", help="show everything, offer no action")
    parser.set_defaults(handler=dashboard_command)


def dashboard_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob dashboard``."""
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"uniqjob dashboard needs the dashboard extra ({exc.name} is missing): "
            "pip install 'uniqjob[dashboard]'"
        ) from None
    app = create_app(open_backend(args.url), read_only=args.read_only)
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # now: a client that reads the line below may connect at once
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving on http://{shown}:{port}/", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])
    return EX_OK
