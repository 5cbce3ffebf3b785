"""Concurrency keys on the command line: ``locks --concurrency``, ``release KEY``, ``discard-parked KEY``.

A key at its limit looks like a stalled pipeline from outside. The view lists
keys busiest first (most parked, longest wait) with slots held / limit, their
lease state and the jobs parked behind them, and ends with true totals over
every key however short the list is cut. The escape hatches act on one key.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..ops import KeyReport, Released, Totals, concurrency, discard_parked
from ._common import (
    EX_FAILURE,
    EX_OK,
    SubParsers,
    add_quiet_option,
    add_url_option,
    duration,
    escape,
    open_backend,
    say,
    whole_number,
)

__all__ = [
    "add_concurrency_options",
    "add_discard_parked_parser",
    "concurrency_locks_command",
    "report_released",
]

_TOP = 50  # keys the table shows by default; the totals always count them all


def add_concurrency_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--concurrency`` and ``--top`` to ``uniqjob locks``."""
    parser.add_argument(
        "--concurrency",
        action="store_true",
        help="show concurrency keys instead: slots held / limit, lease state, parked jobs, busiest first",
    )
    parser.add_argument(
        "--top",
        type=whole_number(0, math.inf, "a whole number >= 0"),
        default=None,
        metavar="N",
        help=f"with --concurrency: the N busiest keys (default {_TOP}; 0: all); totals count every key",
    )


_HEADER = f"{'HELD':<7}  {'LEASE':<6}  {'RUN':<4}  {'PARKED':<7}  {'WAITED':<8}  KEY"


def _line(row: KeyReport) -> str:
    held = f"{row.held}/{row.limit}"
    waited = duration(row.oldest_wait)
    return f"{held:<7}  {row.lease:<6}  {row.running:<4}  {row.parked:<7}  {waited:<8}  {escape(row.key)}"


def _totals_line(totals: Totals, shown: int) -> str:
    listed = f"{totals.keys} key(s)" + (f" ({shown} shown)" if shown < totals.keys else "")
    stale_note = f" ({totals.stale_slots} stale)" if totals.stale_slots else ""
    waiting = f", oldest waiting {duration(totals.oldest_wait)}" if totals.oldest_wait is not None else ""
    return (
        f"{listed}: {totals.slots_held} slot(s) held{stale_note}, {totals.keys_at_limit} at their limit, "
        f"{totals.parked} job(s) parked{waiting}"
    )


def concurrency_locks_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob locks --concurrency``."""
    top = _TOP if args.top is None else args.top
    report = concurrency(open_backend(args.url), top=top or None, job_class=args.job_class)
    out = sys.stdout
    if args.json:
        # JSON Lines of key rows only, as `locks --json`: the totals are `uniqjob stats --json`'s
        for row in report.keys:
            out.write(json.dumps(row.to_json()) + "\n")
        if report.left_out and not args.quiet:
            print(
                f"{report.left_out} more key(s) not shown (--top); totals of every key: uniqjob stats --json",
                file=sys.stderr,
            )
        return EX_OK
    if report.keys:
        out.write(_HEADER + "\n")
        for row in report.keys:
            out.write(_line(row) + "\n")
    elif not args.quiet:
        print("no concurrency slots held, no jobs parked", file=sys.stderr)
    if report.totals.keys:
        out.write(_totals_line(report.totals, len(report.keys)) + "\n")
    return EX_OK


def report_released(done: Released) -> int:
    """Report what ``uniqjob release KEY`` did to a concurrency key; return the exit status."""
    key = done.key
    holders = ", ".join(
        f"pid {s.holder.pid} on {s.holder.host}" if s.holder is not None else f"{s.status} in its queue"
        for s in done.fresh
    )
    if done.kept:
        say(
            f"kept {done.kept} slot(s) of {key!r} whose lease is fresh ({holders}): their jobs may be "
            "running; use --force to release them too"
        )
    if done.forced:
        most = done.limit + done.forced
        say(
            f"WARNING: released {done.forced} slot(s) whose lease was fresh ({holders}): if their jobs are "
            f"still running, up to {most} may run at once (limit {done.limit}) until they end"
        )
    if done.unpushed:
        say(
            f"{done.unpushed} promoted job(s) could not be pushed to their queue from here (see above); "
            "a worker's next sweep pushes them"
        )
    if not done.released and not done.promoted:
        return EX_FAILURE
    released = f"released {done.released} slot(s) of {escape(key)} (limit {done.limit})"
    print(f"{released}; promoted {done.promoted} parked")
    return EX_OK


_DISCARD_EPILOG = """\
The jobs parked behind KEY (as `uniqjob locks --concurrency` shows it) are
dropped and will not run; their uniqueness locks go with them. A process
waiting inline for its turn returns without running. Slots held are left
alone. There is deliberately no way to discard every key's jobs at once.
Exit status 1 if nothing was parked.

examples:
  uniqjob locks --concurrency                # find the key
  uniqjob discard-parked 'app.jobs.Export:acct-42'
"""


def add_discard_parked_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob discard-parked``."""
    parser = subparsers.add_parser(
        "discard-parked",
        help="drop the jobs parked behind one concurrency key",
        description="Drop every job parked behind the concurrency key KEY; they will not run.",
        epilog=_DISCARD_EPILOG,
    )
    parser.add_argument("key", metavar="KEY")
    add_url_option(parser)
    add_quiet_option(parser)
    parser.set_defaults(handler=discard_parked_command)


def discard_parked_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob discard-parked``."""
    count = discard_parked(args.key, open_backend(args.url))
    if not count:
        say(f"nothing parked on {args.key!r}")
        return EX_FAILURE
    if not args.quiet:
        print(f"discarded {count} parked job(s) of {escape(args.key)}; they will not run")
    return EX_OK
