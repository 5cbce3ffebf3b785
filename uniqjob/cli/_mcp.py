"""``uniqjob mcp``: a read-only Model Context Protocol server on stdio (``uniqjob[mcp]``, the ``mcp`` SDK).

Two tools, so an agent can answer "why is this job stuck?" without reading
the store itself, each returning what the command line prints as JSON:

- ``locks`` (``job_class``, ``limit``): ``{"locks": [row, ...], "more": bool,
  "duplicates": {CLASS: N}, "coalesced": {...}, "replaced": {...}, "window_s": 3600}``,
  each row the object of ``uniqjob locks --json``, and the counts of ``uniqjob stats --json``;
- ``concurrency`` (``top``, ``job_class``): ``{"keys": [key, ...], "totals":
  {...}, "left_out": N}``, each key the object of ``uniqjob locks --concurrency --json``, the
  totals those of ``uniqjob stats --json``.

Neither changes anything: they only read, through :mod:`uniqjob.ops`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import __version__, ops
from ..errors import ConfigurationError, UniqJobError
from ..ops import drops, iter_rows
from ..stores._drops import WINDOW
from ..stores.base import Backend
from ._common import EX_OK, SubParsers, add_url_option, open_backend

if TYPE_CHECKING:
    from mcp.server import MCPServer

__all__ = ["add_mcp_parser", "build_server"]

#: Rows the ``locks`` tool returns unless asked for more or fewer, and the most it returns.
LIMIT = 100
MAX_LIMIT = 10_000

_EPILOG = """\
The server speaks MCP over stdin and stdout (logs go to stderr); an MCP client
starts it as a command. Its tools only read the store:

  locks        held locks: the rows of `uniqjob locks --json`
               (arguments: job_class, limit; default 100), with the duplicates dropped
               per class in the last hour
  concurrency  the busiest concurrency keys and the totals over all of them, as
               `uniqjob locks --concurrency --json` (arguments: top, default 20; job_class)

Needs the mcp extra: pip install 'uniqjob[mcp]'.

example (a client's configuration):
  {"command": "uniqjob", "args": ["mcp", "--url", "redis://redis.internal:6379/0"]}
"""


def add_mcp_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob mcp``."""
    parser = subparsers.add_parser(
        "mcp",
        help="serve read-only lock and concurrency tools to an agent (Model Context Protocol, stdio)",
        description="Run a Model Context Protocol server on stdio; its tools (locks, concurrency) only read.",
        epilog=_EPILOG,
    )
    add_url_option(parser)
    parser.set_defaults(handler=mcp_command)


def _check_count(name: str, value: object) -> None:
    """An agent's argument may be anything JSON holds: refuse what is not a count from 1 to MAX_LIMIT."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_LIMIT:
        raise ValueError(f"{name} must be a whole number from 1 to {MAX_LIMIT}, got {value!r}")


def build_server(backend: Backend) -> MCPServer[Any]:
    """An MCP server (``mcp.server.MCPServer``) with the two read-only tools, over ``backend``."""
    try:
        from mcp.server import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.types import ToolAnnotations
    except ImportError as exc:
        raise ConfigurationError(
            f"uniqjob mcp needs the mcp SDK: pip install 'uniqjob[mcp]' ({exc})"
        ) from exc
    server: MCPServer[Any] = MCPServer("uniqjob", version=__version__, instructions=__doc__)
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)

    @contextlib.contextmanager
    def said_to_agent() -> Iterator[None]:
        try:
            yield
        except (ValueError, UniqJobError) as exc:  # a bad argument, the store's error
            raise ToolError(str(exc)) from exc

    @server.tool(annotations=read_only)
    def locks(job_class: str | None = None, limit: int = LIMIT) -> dict[str, Any]:
        """List held unique locks (state, holder, age, lease left, orphaned, class, arguments, key).

        ``job_class``: only this class (full name or last dotted part); ``limit``: at most this
        many rows (default 100; ``more`` says whether there were more). ``duplicates``: calls
        dropped per class in the last hour because their key was held; ``coalesced`` and
        ``replaced``: calls taken in by a queued or pending call, or that replaced a queued one.
        """
        with said_to_agent():
            _check_count("limit", limit)
            rows = list(itertools.islice(iter_rows(backend, job_class=job_class), limit + 1))
            return {
                "locks": [row.to_json() for row in rows[:limit]],
                "more": len(rows) > limit,
                **drops(backend, job_class=job_class),  # duplicates, coalesced, replaced
                "window_s": WINDOW,
            }

    @server.tool(annotations=read_only)
    def concurrency(top: int = 20, job_class: str | None = None) -> dict[str, Any]:
        """The busiest concurrency keys (slots held of the limit, lease state, parked jobs, oldest wait).

        ``totals`` count every key however few are listed; ``left_out`` says how many were not.
        """
        with said_to_agent():
            _check_count("top", top)
            report = ops.concurrency(backend, top=top, job_class=job_class)
            return {
                "keys": [row.to_json() for row in report.keys],
                "totals": report.totals.to_json(),
                "left_out": report.left_out,
            }

    return server


def mcp_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob mcp``: serve on stdio until the client closes it."""
    server = build_server(open_backend(args.url))
    server.run("stdio")
    return EX_OK
