"""``uniqjob locks``, ``release`` and ``reap``: see the locks in a store and clear them.

A listing is a stream of :class:`uniqjob.ops.LockRow` records, one per held key, rendered
either as JSON lines or as a table whose columns are listed in ``COLUMNS``: a
new view adds a field to the record and, if people should see it, a column.

A record the store cannot read is a row in state ``corrupt`` (it blocks its
key), never skipped: ``locks`` and ``reap`` then exit 65, and ``release
--force`` removes it. Every field printed has its control characters escaped.
The work is done by :mod:`uniqjob.ops`; this module parses, prints and picks exit codes.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..ops import CORRUPT, LockRelease, LockRow, iter_rows, reap, release
from ..stores.base import Backend
from ._common import (
    EX_DATAERR,
    EX_FAILURE,
    EX_OK,
    EX_SOFTWARE,
    SubParsers,
    UsageError,
    add_quiet_option,
    add_url_option,
    duration,
    escape,
    open_backend,
    say,
)
from ._concurrency import add_concurrency_options, concurrency_locks_command, report_released

__all__ = [
    "COLUMNS",
    "Column",
    "add_locks_parser",
    "add_reap_parser",
    "add_release_parser",
]


@dataclass(frozen=True)
class Column:
    """One column of the ``locks`` table: a header, a width (0: last, unpadded) and a cell."""

    header: str
    width: int
    cell: Callable[[LockRow], str]


def _left(row: LockRow) -> str:
    return duration(row.lease_s if row.lease_s is not None else row.ttl_s)


def _holder(row: LockRow) -> str:
    return f"{row.host}:{row.pid}" if row.host is not None else "-"


def _orphan(row: LockRow) -> str:
    return "-" if row.state == CORRUPT else "yes" if row.orphaned else "no"


def _job(row: LockRow) -> str:
    if row.state == CORRUPT:
        text = escape(f"unreadable: {row.reason}")
    else:
        text = escape(f"{row.job_class or '?'}({row.args or ''})")
        if row.due_s is not None:
            text += f" due in {duration(row.due_s)}"
        if row.pending is not None:
            text += escape(f" then ({row.pending})")
    return text if len(text) <= _JOB_WIDTH else text[: _JOB_WIDTH - 3] + "..."


def _overlap(row: LockRow) -> str:
    """A ``uniqjob run --overlap`` request about this lock: a run waiting for it, or a stop asked of it."""
    if row.stop_asked_by:
        return f"stop by {row.stop_asked_by}"
    return f"next {row.pending_run}" if row.pending_run else "-"


def _key(row: LockRow) -> str:
    """The key, or where the record is when it names none (what ``release --force`` takes)."""
    return row.key if row.key is not None else row.path or "?"


_JOB_WIDTH = 40  # the full arguments are in --json


COLUMNS: list[Column] = [
    Column("STATE", 8, lambda r: r.state),
    Column("HOLDER", 22, _holder),
    Column("AGE", 8, lambda r: duration(r.age_s)),
    Column("LEFT", 8, _left),
    Column("ORPHAN", 7, _orphan),
    Column("JOB", _JOB_WIDTH, _job),
    Column("JOB_ID", 36, lambda r: r.job_id or "-"),  # a uuid's length: RQ's and Celery's ids
    Column("OVERLAP", 20, _overlap),
    Column("KEY", 0, _key),
]


def _table_line(cells: list[str]) -> str:
    # Every cell escaped: a key, host or class is anyone's string, and must not steer the terminal.
    return "  ".join(
        escape(c).ljust(col.width) if col.width else escape(c) for col, c in zip(COLUMNS, cells, strict=True)
    )


_LOCKS_EPILOG = """\
LEFT is the run lock's lease left (renewed by its holder's heartbeat) or, for a
queued lock, the time left before it autoexpires. An orphaned lock is one whose
holder is dead; `uniqjob reap` reclaims those.

A record the store cannot read is listed in state "corrupt" (whatever --class
says: its class cannot be read), with its path and why; it blocks its key until
removed with `uniqjob release --force KEY` (or the path, if it names no key).
The exit status is then 65.

STATE is queued (waiting in its queue), parked (waiting for a concurrency slot, in
no queue yet), running, or corrupt. JOB_ID is the queue's id of the job (RQ, Celery),
recorded when it was enqueued; "-" for a lock with none (inline, `uniqjob run`, parked).
OVERLAP is what `uniqjob run --overlap` asked of the lock: "next HOST:PID", the run
waiting to run once it ends (buffer-one), or "stop by HOST:PID", the run that asked
its holder to stop (terminate-other); "-" if nothing.

JOB says "due in 3.0s" for a debounced job (unique_debounce) not yet due, and "then
(ARGS)" for the call that waits behind a running one (unique_on_conflict keep_last).

--json fields: key, class, args, state, job_id, host, pid, age_s, ttl_s, lease_s,
orphaned, path, reason (these two only set, and key may be null, for a corrupt record),
pending_run, stop_asked_by (`uniqjob run --overlap`), pending (the waiting call's arguments),
due_s (seconds until a debounced job is due); null unless set;
every line is a lock row (JSON Lines: `jq .key` reads them all). The dropped
duplicates and other figures are in `uniqjob stats --json`.

--concurrency lists concurrency keys instead: HELD slots / limit, their LEASE
(fresh, stale: lapsed or its holder dead, mixed), RUN(ning), PARKED jobs and how
long the oldest has WAITED; busiest first, then totals over every key. --json
fields: key, class, limit, held, running, fresh, stale, lease, at_limit, parked,
oldest_wait_s; every line is a key row (the totals are in `uniqjob stats --json`).

examples:
  uniqjob locks
  uniqjob locks --url redis://redis.internal:6379/0 --json | jq -r 'select(.orphaned) | .key'
  uniqjob locks --class uniqjob.cli.run      # only locks taken by `uniqjob run`
  uniqjob locks --concurrency --top 10       # the ten busiest concurrency keys, and totals
  uniqjob locks --url redis://redis.internal:6379/0 --namespace myapp   # RedisBackend(namespace=)
"""


def add_locks_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob locks``."""
    parser = subparsers.add_parser(
        "locks",
        help="list held locks",
        description="List the held locks in the store, one per key, as they are scanned.",
        epilog=_LOCKS_EPILOG,
    )
    add_url_option(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--class",
        dest="job_class",
        metavar="NAME",
        help="only locks of this job class (full name, or its last dotted part)",
    )
    add_concurrency_options(parser)
    add_quiet_option(parser)
    parser.set_defaults(handler=locks_command)


def locks_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob locks``."""
    if args.concurrency:
        return concurrency_locks_command(args)
    if args.top is not None:
        raise UsageError("--top counts concurrency keys: give it with --concurrency")
    backend = open_backend(args.url)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        # A key is any string (Redis keys may not even be UTF-8): show it, never crash on it.
        out.reconfigure(errors="backslashreplace")
    corrupt: list[LockRow] = []
    header_written = False
    for row in iter_rows(backend, job_class=args.job_class):
        if row.state == CORRUPT:
            corrupt.append(row)
        if args.json:
            out.write(json.dumps(row.to_json()) + "\n")
            continue
        if not header_written:
            out.write(_table_line([c.header for c in COLUMNS]) + "\n")
            header_written = True
        out.write(_table_line([c.cell(row) for c in COLUMNS]) + "\n")
    if not args.json and not header_written and not args.quiet:
        print(_none_held(backend, args.job_class), file=sys.stderr)
    if corrupt:
        out.flush()
        for row in corrupt:
            say(f"{_corrupt_line(row)}; it blocks its key until removed with: {_fix(row)}")
        return EX_DATAERR
    return EX_OK


#: How many records ``locks`` looks at, at most, for other namespaces when its own holds none.
NAMESPACES_LOOKED_AT = 100_000


def _none_held(backend: Backend, job_class: str | None) -> str:
    """What ``locks`` says for an empty listing: the store and namespace read, and where locks are."""
    what = "no locks" if job_class is None else f"no locks of class {job_class!r}"
    namespace = getattr(backend, "namespace", None)
    if not isinstance(namespace, str):
        return f"{what} held in {backend!r}"
    said = f"{what} held in {backend!r}, namespace {namespace!r}"
    others = [n for n in backend.namespaces(limit=NAMESPACES_LOOKED_AT) if n != namespace]
    if not others:
        return said
    shown = ", ".join(repr(escape(n)) for n in others[:5])
    if others[5:]:
        shown += f" and {len(others) - 5} more"
    option = f"--namespace {_shell_word(others[0])}"
    return f"{said}; locks are held under namespace {shown}: add {option} to see them"


def _corrupt_line(row: LockRow) -> str:
    what = f"record {row.path}" + (f" of key {row.key!r}" if row.key is not None else "")
    return f"corrupt lock {what}: {row.reason}"


def _fix(row: LockRow) -> str:
    return f"uniqjob release --force {_shell_word(_key(row))}"


def _shell_word(text: str) -> str:
    """``text`` as one shell word; with control characters, in ``$'...'`` quotes that spell them out."""
    if escape(text) == text:
        return shlex.quote(text)
    return "$'" + escape(text.replace("\\", "\\\\").replace("'", "\\'")) + "'"


_RELEASE_EPILOG = """\
A lock whose run holder is alive (its lease is fresh) is kept unless --force:
its command would then run on unlocked. A `uniqjob run` whose lock is taken
away notices at its next heartbeat and stops its command. A queued lock, or
one whose holder is dead, is released. Exit status 1 if nothing was released.

A record the store cannot read (state "corrupt" in `uniqjob locks`) blocks its
key; it is removed only with --force, given its key or, if it names none, the
path `uniqjob locks` shows. Without --force the exit status is then 65.

A concurrency key (as `uniqjob locks --concurrency` shows it) has its stale
slots released and the oldest parked jobs promoted into them, never past its
limit; --force releases slots with a fresh lease too, whose jobs may still run.

examples:
  uniqjob locks                      # find the key
  uniqjob release 'uniqjob.cli.run:1:0f3a...'
  uniqjob release --force reports    # the holder is known to be gone
"""


def add_release_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob release``."""
    parser = subparsers.add_parser(
        "release",
        help="drop one key's locks",
        description="Release the queue and run locks of KEY (as `uniqjob locks` shows it).",
        epilog=_RELEASE_EPILOG,
    )
    parser.add_argument("key", metavar="KEY")
    add_url_option(parser)
    parser.add_argument("--force", action="store_true", help="release even if the holder is alive")
    add_quiet_option(parser)
    parser.set_defaults(handler=release_command)


def release_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob release``."""
    key: str = args.key
    backend = open_backend(args.url)
    done = release(key, backend, force=args.force)
    if done is None:
        say(f"no lock on {key!r}")
        return EX_FAILURE
    if not isinstance(done, LockRelease):
        return report_released(done)  # a key of `locks --concurrency`
    row = done.row
    if done.done == "released":
        if row.host is not None and not row.orphaned:  # --force took it from a live holder
            say(
                f"WARNING: released {key!r} from a live holder, pid {row.pid} on {row.host} (its lease had"
                f" {row.lease_s or 0.0:.1f}s left): its job is probably still running, now unlocked; a"
                " `uniqjob run` holder stops its command at its next heartbeat"
            )
        if not args.quiet:
            print(f"released {escape(key)} ({escape(_describe(row))})")
        return EX_OK
    if done.done == "alive":
        say(
            f"not releasing {key!r}: its holder, pid {row.pid} on {row.host}, "
            f"is alive (its lease has {row.lease_s or 0.0:.1f}s left); use --force to release it anyway"
        )
        return EX_FAILURE
    if done.done == "changed":
        say(f"{key!r} changed hands while releasing; nothing released")
        return EX_FAILURE
    if done.done == "corrupt":
        say(f"not releasing: {_corrupt_line(row)}; it blocks its key: remove it with {_fix(row)}")
        return EX_DATAERR
    if done.done == "unsupported":
        say(f"the {backend.name} store cannot remove records by force; remove {row.path} by hand")
        return EX_SOFTWARE
    if done.done == "gone":
        say(f"{key!r}: its corrupt record was gone already; nothing removed")
        return EX_FAILURE
    what = ("of " + escape(row.key) + ": " if row.key is not None else "") + escape(", ".join(done.removed))
    print(f"removed corrupt record {what} (it was unreadable: {escape(row.reason or '')})")
    return EX_OK


def _describe(row: LockRow) -> str:
    parts = [row.state]
    if row.host is not None:
        parts.append(f"pid {row.pid} on {row.host}")
    if row.orphaned:
        parts.append("orphaned")
    return ", ".join(parts)


_REAP_EPILOG = """\
Applies exactly the library's orphan rule: a lock in state "running" whose run
lock lapsed, or whose holder on this host is provably dead (pid gone or
reused). Queued locks and live holders are never touched, and a lock taken
again meanwhile is left alone (reclaim checks its token). A record that
cannot be read is skipped, named on stderr with the command that removes it,
and the exit status is then 65.

Each lock reclaimed is a line on stdout, then a count on stderr (also when it is 0).
--quiet prints nothing unless a lock was reclaimed or a record is corrupt: then
the same lines and count, so a cron line mails each reclaim and nothing else.

examples:
  uniqjob reap --dry-run
  */10 * * * *  uniqjob reap --quiet --url redis://redis.internal:6379/0
"""


def add_reap_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob reap``."""
    parser = subparsers.add_parser(
        "reap",
        help="reclaim orphaned locks",
        description="Reclaim every orphaned lock in the store and report each one.",
        epilog=_REAP_EPILOG,
    )
    add_url_option(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="report what would be reclaimed, change nothing"
    )
    add_quiet_option(parser)
    parser.set_defaults(handler=reap_command)


def reap_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob reap``."""
    verb = "would reclaim" if args.dry_run else "reclaimed"

    def show(row: LockRow) -> None:
        if row.state != CORRUPT:
            print(f"{verb} {escape(_key(row))} ({escape(_describe(row))})")  # news, even with --quiet
            return
        sys.stdout.flush()  # its line after the reclaims already printed, when both go to one terminal
        say(f"skipping {_corrupt_line(row)}; remove it with {_fix(row)}")

    done = reap(open_backend(args.url), dry_run=args.dry_run, each=show)
    skipped = f"; skipped {len(done.corrupt)} corrupt record(s)" if done.corrupt else ""
    if done.reclaimed or done.corrupt or not args.quiet:
        print(f"{verb} {len(done.reclaimed)} orphaned lock(s) of {done.held} held{skipped}", file=sys.stderr)
    return EX_DATAERR if done.corrupt else EX_OK
