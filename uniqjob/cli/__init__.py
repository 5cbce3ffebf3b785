"""The ``uniqjob`` command: a cron drop-in (``uniqjob run -- CMD``) and lock inspection.

Each subcommand lives in a module of its own as one ``add_*_parser(subparsers)``
function that registers its parser and sets ``handler`` (``Namespace -> int``,
the exit status); ``SUBCOMMANDS`` maps each name to that module and function, in
``--help`` order. Adding a subcommand is one such function and one line there.
The command imports only the module of the subcommand it runs (``uniqjob run``
from cron never loads the dashboard's, the MCP server's or the reports' code).

Errors are one line on stderr with sysexits codes: 64 usage, 65 a lock record
that cannot be read, 69 store unreachable, 70 an internal error, 78
configuration, 1 nothing to do (e.g. no such lock), and 75 only for "held
elsewhere". Never a traceback: whatever a record holds, whatever a client
raises, the command says what went wrong in one line (control characters
escaped) and exits with its code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from .. import __version__
from ..errors import BackendError, ConfigurationError, CorruptRecordError, UniqJobError
from ..stores import _log
from ._common import (
    EX_CONFIG,
    EX_DATAERR,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    EX_USAGE,
    PROG,
    Parser,
    SubParsers,
    UsageError,
    escape,
    say,
    store_url,
)

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: The subcommands, in ``--help`` order: name -> (module of this package, its ``add_*_parser``).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("._run", "add_run_parser"),
    "locks": ("._locks", "add_locks_parser"),
    "release": ("._locks", "add_release_parser"),
    "reap": ("._locks", "add_reap_parser"),
    "discard-parked": ("._concurrency", "add_discard_parked_parser"),
    "stats": ("._stats", "add_stats_parser"),
    "mcp": ("._mcp", "add_mcp_parser"),
    "dashboard": ("._dashboard", "add_dashboard_parser"),
}

_EPILOG = """\
examples:
  uniqjob run -- echo hello                 # file store, no server needed
  uniqjob run --url redis://localhost:6379/0 -- ./nightly-export.sh
  uniqjob locks --json
  uniqjob <command> --help                  # each command's options and examples
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Return the ``uniqjob`` argument parser with every subcommand registered.

    Given the name of one subcommand, only that one is registered (and its module
    imported): what :func:`main` parses a command line with.
    """
    parser = Parser(
        prog=PROG,
        description="Run commands at most once at a time, on one host or many, and see their locks.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="<command>", dest="command_name")
    for name in SUBCOMMANDS if command is None else [command]:
        module, function = SUBCOMMANDS[name]
        add: Callable[[SubParsers], None] = getattr(import_module(module, __name__), function)
        add(subparsers)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs, if it names one (the top level takes no option with a value)."""
    for arg in argv:
        if arg == "--" or not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def _library_warnings_to_stderr() -> contextlib.AbstractContextManager[None]:
    """Within the block, library warnings (a reclaimed orphan, a failing heartbeat) are one line each on
    stderr, no traceback."""

    def setup() -> Callable[[], None]:
        import logging

        class OneLine(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                message = record.getMessage()
                if record.exc_info and record.exc_info[1] is not None:
                    message += f": {record.exc_info[1]}"
                return f"{PROG}: {escape(message)}"  # a key in a message must not steer the terminal

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(OneLine())
        handler.setLevel(logging.WARNING)
        logger = logging.getLogger("uniqjob")
        logger.addHandler(handler)
        return lambda: logger.removeHandler(handler)

    # Set up when a logger of ours is first used: a run that logs nothing never loads logging.
    return _log.configured(setup)


def _origin(args: argparse.Namespace, exc: Exception) -> str:
    """Where the store of an error came from when no --url named it: `` (the store of UNIQJOB_URL=...)``."""
    from .. import config
    from ..stores._urls import shown

    url = os.environ.get(config.ENV_URL)
    given = getattr(args, "url", None) is not None and not getattr(args, "env_url", False)
    if given or not url or config.ENV_URL in str(exc):
        return ""
    return f" (the store of {config.ENV_URL}={shown(url)})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``uniqjob`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(_command_of(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already exit 64)
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    handler = getattr(args, "handler", None)
    if handler is None:
        say("error: no command given (see uniqjob --help)")
        return EX_USAGE
    try:
        if getattr(args, "namespace", None) is not None:
            args.env_url = args.url is None  # the URL is UNIQJOB_URL's, with the namespace put in
            args.url = store_url(args.url, args.namespace)
        with _library_warnings_to_stderr():
            status: int = handler(args)
            sys.stdout.flush()  # here, where a closed pipe is handled, not at interpreter exit
    except UsageError as exc:
        say(f"error: {exc} (see uniqjob {args.command_name} --help)")
        return EX_USAGE
    except ConfigurationError as exc:
        say(f"configuration error: {exc}{_origin(args, exc)}")
        return EX_CONFIG
    except CorruptRecordError as exc:  # a BackendError, but the store answered: its record is damaged
        say(str(exc))
        return EX_DATAERR
    except BackendError as exc:
        say(f"lock store unavailable: {exc}{_origin(args, exc)}")
        return EX_UNAVAILABLE
    except UniqJobError as exc:
        say(str(exc))
        return EX_SOFTWARE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`uniqjob locks | head`): not an error worth a line.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as exc:  # a bug, or a client's own error: one line, never a traceback
        say(f"internal error in `{PROG} {args.command_name}`: {type(exc).__qualname__}: {exc}")
        return EX_SOFTWARE
    return status
