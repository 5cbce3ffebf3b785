"""``uniqjob locks``, ``release`` and ``reap``: see the locks in a store and clear them.

A listing is a stream of :class:`LockRow` records, one per held key, rendered
either as JSON lines or as a table whose columns are listed in ``COLUMNS``: a
new view adds a field to the record and, if people should see it, a column.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

from ..backends.base import Backend
from ..locks import RUNNING, LockState, holder_is_dead, orphaned
from ._common import EX_FAILURE, EX_OK, HelpFormatter, SubParsers, add_url_option, open_backend
from ._concurrency import add_concurrency_options, concurrency_locks_command, release_concurrency

__all__ = [
    "COLUMNS",
    "Column",
    "LockRow",
    "add_locks_parser",
    "add_reap_parser",
    "add_release_parser",
    "iter_rows",
]


@dataclass(frozen=True, slots=True)
class LockRow:
    """One held key as ``uniqjob locks`` reports it; ``json`` metadata renames a field in JSON.

    Times are seconds: ``age_s`` since the lock was taken, ``ttl_s`` left
    before the queue lock autoexpires, ``lease_s`` left on the run lock's lease.
    """

    key: str
    job_class: str | None = field(default=None, metadata={"json": "class"})
    args: str | None = None
    state: str = RUNNING
    host: str | None = None
    pid: int | None = None
    age_s: float = 0.0
    ttl_s: float | None = None
    lease_s: float | None = None
    orphaned: bool = False

    @classmethod
    def from_state(cls, state: LockState) -> LockRow:
        """Describe a snapshot of one key's locks (which must not be free)."""
        queue, run = state.queue, state.run
        since = queue.since if queue is not None else run.started if run is not None else state.now
        return cls(
            key=state.key,
            job_class=(queue.meta.cls or None) if queue is not None else None,
            args=(queue.meta.args or None) if queue is not None else None,
            # A run lock whose queue lock autoexpired is still a running job.
            state=queue.state if queue is not None else RUNNING,
            host=run.holder.host if run is not None else None,
            pid=run.holder.pid if run is not None else None,
            age_s=round(max(state.now - since, 0.0), 3),
            ttl_s=round(queue.ttl, 3) if queue is not None and queue.ttl is not None else None,
            lease_s=round(run.lease_left, 3) if run is not None else None,
            orphaned=orphaned(state),
        )

    def to_json(self) -> dict[str, object]:
        """Return the record as the JSON object ``locks --json`` prints."""
        return {f.metadata.get("json", f.name): getattr(self, f.name) for f in fields(self)}


def iter_rows(backend: Backend, *, job_class: str | None = None) -> Iterator[LockRow]:
    """Yield a row per held key, streaming the store's scan; keys freed meanwhile are skipped."""
    for key in backend.scan():
        state = backend.read(key)
        if state.free:
            continue
        row = LockRow.from_state(state)
        if job_class is None or _class_matches(row.job_class, job_class):
            yield row


def _class_matches(cls: str | None, wanted: str) -> bool:
    return cls is not None and (cls == wanted or cls.endswith("." + wanted))


@dataclass(frozen=True)
class Column:
    """One column of the ``locks`` table: a header, a width (0: last, unpadded) and a cell."""

    header: str
    width: int
    cell: Callable[[LockRow], str]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _left(row: LockRow) -> str:
    return _duration(row.lease_s if row.lease_s is not None else row.ttl_s)


def _holder(row: LockRow) -> str:
    return f"{row.host}:{row.pid}" if row.host is not None else "-"


def _job(row: LockRow) -> str:
    text = f"{row.job_class or '?'}({row.args or ''})"
    return text if len(text) <= _JOB_WIDTH else text[: _JOB_WIDTH - 3] + "..."


_JOB_WIDTH = 40  # the full arguments are in --json


COLUMNS: list[Column] = [
    Column("STATE", 8, lambda r: r.state),
    Column("HOLDER", 22, _holder),
    Column("AGE", 8, lambda r: _duration(r.age_s)),
    Column("LEFT", 8, _left),
    Column("ORPHAN", 7, lambda r: "yes" if r.orphaned else "no"),
    Column("JOB", _JOB_WIDTH, _job),
    Column("KEY", 0, lambda r: r.key),
]


def _table_line(cells: list[str]) -> str:
    return "  ".join(c.ljust(col.width) if col.width else c for col, c in zip(COLUMNS, cells, strict=True))


_LOCKS_EPILOG = """\
LEFT is the run lock's lease left (renewed by its holder's heartbeat) or, for a
queued lock, the time left before it autoexpires. An orphaned lock is one whose
holder is dead; `uniqjob reap` reclaims those.

--json fields: key, class, args, state, host, pid, age_s, ttl_s, lease_s, orphaned

--concurrency lists concurrency keys instead: HELD slots / limit, their LEASE
(fresh, stale: lapsed or its holder dead, mixed), RUN(ning), PARKED jobs and how
long the oldest has WAITED; busiest first, then totals over every key. --json
fields: key, class, limit, held, running, fresh, stale, lease, at_limit, parked,
oldest_wait_s; the last line is {"totals": {...}, "left_out": N}.

examples:
  uniqjob locks
  uniqjob locks --url redis://redis.internal:6379/0 --json | jq -r 'select(.orphaned) | .key'
  uniqjob locks --class uniqjob.cli.run      # only locks taken by `uniqjob run`
  uniqjob locks --concurrency --top 10       # the ten busiest concurrency keys, and totals
"""


def add_locks_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob locks``."""
    parser = subparsers.add_parser(
        "locks",
        help="list held locks",
        description="List the held locks in the store, one per key, as they are scanned.",
        epilog=_LOCKS_EPILOG,
        formatter_class=HelpFormatter,
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
    parser.set_defaults(handler=locks_command)


def locks_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob locks``."""
    if args.concurrency:
        return concurrency_locks_command(args)
    rows = iter_rows(open_backend(args.url), job_class=args.job_class)
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        # A key is any string (Redis keys may not even be UTF-8): show it, never crash on it.
        out.reconfigure(errors="backslashreplace")
    if args.json:
        for row in rows:
            out.write(json.dumps(row.to_json()) + "\n")
        return EX_OK
    header_written = False
    for row in rows:
        if not header_written:
            out.write(_table_line([c.header for c in COLUMNS]) + "\n")
            header_written = True
        out.write(_table_line([c.cell(row) for c in COLUMNS]) + "\n")
    if not header_written:
        print("no locks held", file=sys.stderr)
    return EX_OK


_RELEASE_EPILOG = """\
A lock whose run holder is alive (its lease is fresh) is kept unless --force:
its command would then run on unlocked. A `uniqjob run` whose lock is taken
away notices at its next heartbeat and stops its command. A queued lock, or
one whose holder is dead, is released. Exit status 1 if nothing was released.

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
        formatter_class=HelpFormatter,
    )
    parser.add_argument("key", metavar="KEY")
    add_url_option(parser)
    parser.add_argument("--force", action="store_true", help="release even if the holder is alive")
    parser.set_defaults(handler=release_command)


def release_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob release``."""
    backend = open_backend(args.url)
    key: str = args.key
    state = backend.read(key)
    if state.free:
        status = release_concurrency(backend, key, force=args.force)  # a key of `locks --concurrency`
        if status is not None:
            return status
        print(f"uniqjob: no lock on {key!r}", file=sys.stderr)
        return EX_FAILURE
    row = LockRow.from_state(state)
    run = state.run
    if run is not None and not args.force and not holder_is_dead(run.holder):
        print(
            f"uniqjob: not releasing {key!r}: its holder, pid {run.holder.pid} on {run.holder.host}, "
            f"is alive (its lease has {run.lease_left:.1f}s left); use --force to release it anyway",
            file=sys.stderr,
        )
        return EX_FAILURE
    queue_token = state.queue.token if state.queue is not None else None
    if not backend.reclaim(key, queue_token, run.token if run is not None else None):
        print(f"uniqjob: {key!r} changed hands while releasing; nothing released", file=sys.stderr)
        return EX_FAILURE
    print(f"released {key} ({_describe(row)})")
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
again meanwhile is left alone (reclaim checks its token).

examples:
  uniqjob reap --dry-run
  */10 * * * *  uniqjob reap --url redis://redis.internal:6379/0 >/dev/null
"""


def add_reap_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob reap``."""
    parser = subparsers.add_parser(
        "reap",
        help="reclaim orphaned locks",
        description="Reclaim every orphaned lock in the store and report each one.",
        epilog=_REAP_EPILOG,
        formatter_class=HelpFormatter,
    )
    add_url_option(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="report what would be reclaimed, change nothing"
    )
    parser.set_defaults(handler=reap_command)


def reap_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob reap``."""
    backend = open_backend(args.url)
    seen = reaped = 0
    for key in backend.scan():
        state = backend.read(key)
        if state.free:
            continue
        seen += 1
        if not orphaned(state):
            continue
        row = LockRow.from_state(state)
        if args.dry_run:
            print(f"would reclaim {key} ({_describe(row)})")
            reaped += 1
            continue
        # An orphan's queue lock (if any) is in state "running": the rule never frees a queued one.
        queue_token = state.queue.token if state.queue is not None else None
        run_token = state.run.token if state.run is not None else None
        if backend.reclaim(key, queue_token, run_token):
            print(f"reclaimed {key} ({_describe(row)})")
            reaped += 1
    verb = "would reclaim" if args.dry_run else "reclaimed"
    print(f"{verb} {reaped} orphaned lock(s) of {seen} held", file=sys.stderr)
    return EX_OK
