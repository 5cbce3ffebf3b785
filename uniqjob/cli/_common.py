"""What every subcommand shares: exit codes, the parser class, the store option, number checks."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias
from urllib.parse import parse_qsl, urlsplit

from .. import config
from ..errors import ConfigurationError
from ..settings import run_lease
from ..stores._urls import REDIS_SCHEMES, scheme_of, with_option
from ..stores.base import Backend

# sysexits(3) codes, so cron mail and scripts can tell the failures apart.
EX_OK = 0
EX_FAILURE = 1  # e.g. no lock on the key given to `release`
EX_USAGE = 64
EX_DATAERR = 65  # a lock record cannot be read: it blocks its key until `release --force`
EX_UNAVAILABLE = 69  # the lock store cannot be reached
EX_SOFTWARE = 70
EX_TEMPFAIL = 75  # held elsewhere; no other failure uses it
EX_CONFIG = 78  # a bad URL or setting

PROG = "uniqjob"


class UsageError(Exception):
    """A command line that parses but makes no sense (exit 64)."""


def _columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` gives it: ``$COLUMNS``, else stdout's
    terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter for help laid out as written, sized without importing shutil.

    argparse makes one for each option it adds, to check it, and sizes it to the
    terminal through shutil (with bz2, lzma and zlib): a cost to every start of
    the command for help it seldom prints. The width is the one argparse takes.
    """

    def __init__(self, prog: str) -> None:  # argparse makes each with prog=... alone
        super().__init__(prog, width=_columns() - 2)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit 64, not 2.

    Its help keeps the examples in epilogs laid out as written.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: What an ``add_*_parser`` function receives: call its ``add_parser(name, ...)``.
SubParsers: TypeAlias = "argparse._SubParsersAction[Parser]"


def add_url_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--url`` (where the locks live: else UNIQJOB_URL, else the file store) and ``--namespace``."""
    parser.add_argument(
        "--url",
        metavar="URL",
        help="lock store: redis://host:6379/0, rediss://..., unix:///path.sock, redis+cluster://h1:6379,h2:6379,"
        " redis+sentinel://h1:26379,h2:26379/MASTER_NAME, valkey://... (and valkeys, valkey+cluster,"
        " valkey+sentinel), file:///dir "
        f"(default: ${config.ENV_URL}, else the file store in {config.default_directory()})",
    )
    parser.add_argument(
        "--namespace",
        metavar="NAME",
        help="a Redis store's namespace, the prefix of its keys (default uniqjob): the same as the URL's"
        " ?namespace=NAME, and the namespace= of RedisBackend(...)",
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--quiet``: no line unless something went wrong."""
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="say nothing on stderr unless something went wrong"
    )


def store_url(url: str | None, namespace: str | None) -> str | None:
    """The store URL of ``--url`` (else UNIQJOB_URL) with ``--namespace`` in its query; None: the default.

    UsageError when the namespace cannot apply: no Redis URL, or one whose own
    ``?namespace=`` differs.
    """
    if namespace is None:
        return url
    target = url if url is not None else os.environ.get(config.ENV_URL)
    if not target:
        raise UsageError(
            f"--namespace needs a Redis store (--url redis://... or ${config.ENV_URL}); the default"
            " file store has no namespaces"
        )
    if not namespace:
        raise UsageError("--namespace must not be empty")
    scheme = scheme_of(target)
    if scheme not in REDIS_SCHEMES:
        raise UsageError(f"--namespace applies to Redis stores; a {scheme or 'schemeless'}:// store has none")
    parts = urlsplit(target)
    given = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "namespace"]
    if given:
        if given != [namespace]:
            raise UsageError(
                f"--namespace {namespace!r} and the URL's ?namespace={given[-1]} differ: give one of them"
            )
        return target
    return with_option(target, "namespace", namespace)


def open_backend(url: str | None) -> Backend:
    """Return the store named by ``url``, else the library's default (UNIQJOB_URL, else files)."""
    backend = config.resolve(url) if url is not None else config.default_backend()
    if backend.name == "memory":
        # Each process would see only its own locks: no command could ever conflict.
        raise ConfigurationError(
            "memory:// keeps locks inside one process; the uniqjob command needs "
            "a shared store (redis://..., file:///dir)"
        )
    return backend


def lease(text: str) -> float:
    """argparse type: a run lease, :data:`~uniqjob.settings.MIN_RUN_LEASE` to ``MAX_RUN_LEASE`` seconds."""
    try:
        return run_lease(_number(text), "a lease")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def wait_seconds(text: str) -> float:
    """argparse type: seconds to wait, zero or more, or ``inf`` (as long as it takes)."""
    if text.strip().lower() in ("inf", "infinity", "forever"):
        return math.inf
    return seconds(text)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds, zero or more."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above zero."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def whole_number(lowest: int, highest: float, expected: str) -> Callable[[str], int]:
    """argparse type: a whole number from ``lowest`` to ``highest``; else "expected <expected>, got ..."."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lowest - 1
        if not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


#: argparse type: a process exit status.
exit_code = whole_number(0, 255, "an exit status 0-255")


def duration(seconds: float | None) -> str:
    """``seconds`` for a table: ``4.2s``, ``3m07s``, ``2h05m``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


# Whatever could steer a terminal or start a line of its own: C0 and C1 controls,
# line and paragraph separators, bidirectional overrides, lone surrogates (an
# undecodable Redis key) and zero-width marks that hide text. Compiled on first use (re
# keeps it): a run that says nothing need not pay for it.
_UNSAFE = "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape(text: str) -> str:
    """Return ``text`` with every control character written as an escape (``\\x1b``, ``\\n``, ``\\u202e``).

    Keys, hosts and class names are anyone's strings: printed raw, one holding
    ``ESC ] 0 ; ... BEL`` retitles the terminal and one holding a newline forges
    a row. Text with nothing to escape comes back as it is (escaping twice is
    escaping once); ``--json`` output needs none of this, JSON escapes them.
    """
    return re.sub(_UNSAFE, _escaped, text)


def say(message: str) -> None:
    """Write one line to stderr, prefixed with the program name, its control characters escaped."""
    print(f"{PROG}: {escape(message)}", file=sys.stderr, flush=True)
