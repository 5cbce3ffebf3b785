"""``uniqjob stats``: the store's figures in one look, the dropped duplicates per job class first.

The figures are :func:`uniqjob.ops.stats`, the same that ``uniqjob.metrics``
exports: a blocked key shows as duplicates dropped, parked jobs or orphans
long before anything fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..ops import Stats, stats
from ..stores._drops import WINDOW
from ._common import EX_DATAERR, EX_OK, SubParsers, add_url_option, escape, open_backend

__all__ = ["add_stats_parser"]

_EPILOG = f"""\
DROPPED counts the calls each job class lost to a held key over the last
--window seconds (default and most {WINDOW:g}): duplicates the policy dropped,
rescheduled or raised, as the store counted them for every process, by the
minute (the window is counted in the whole minutes it overlaps). COALESCED
counts the calls whose arguments a queued or pending call took over
("keep_last", debounce), REPLACED those that took a queued call's place
("replace"); neither is in DROPPED. The locks line counts the pending calls
("keep_last" behind a running call) and the debounced jobs not yet due.

--json prints one object: {{"locks": {{queued, running, orphaned, corrupt, pending,
debouncing}}, "concurrency": {{keys, slots_held, stale_slots, keys_at_limit, parked,
oldest_wait_s}}, "duplicates": {{CLASS: N}}, "coalesced": {{CLASS: N}},
"replaced": {{CLASS: N}}, "window_s": SECONDS}}. The exit status is 65 when a
lock record cannot be read (see `uniqjob locks`).

examples:
  uniqjob stats
  uniqjob stats --url redis://redis.internal:6379/0 --json --window 600
"""


def _window(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= WINDOW:
        raise argparse.ArgumentTypeError(
            f"expected seconds > 0 and <= {WINDOW:g} (the stores keep counts for an hour), got {text!r}"
        )
    return value


def add_stats_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob stats``."""
    parser = subparsers.add_parser(
        "stats",
        help="dropped duplicates per job class, and the store's lock and concurrency totals",
        description="Show what the store counted: duplicates dropped per job class, locks held, jobs parked.",
        epilog=_EPILOG,
    )
    add_url_option(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--window",
        type=_window,
        default=WINDOW,
        metavar="SECONDS",
        help=f"count the duplicates of the last SECONDS (default {WINDOW:g}, the most kept)",
    )
    parser.set_defaults(handler=stats_command)


def stats_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob stats``."""
    figures = stats(open_backend(args.url), window=args.window)
    if args.json:
        sys.stdout.write(json.dumps(figures.to_json()) + "\n")
    else:
        sys.stdout.write(_text(figures))
    return EX_DATAERR if figures.corrupt else EX_OK


def _text(figures: Stats) -> str:
    lines = [f"dropped duplicates, last {figures.window:g}s:"]
    kinds = (figures.duplicates, figures.coalesced, figures.replaced)
    classes = list(dict.fromkeys(cls for counts in kinds for cls in counts))  # busiest dropped first
    if not classes:
        lines.append("  none")
    elif not (figures.coalesced or figures.replaced):
        lines.append(f"  {'DROPPED':>8}  CLASS")
        lines += [f"  {n:>8}  {escape(cls)}" for cls, n in figures.duplicates.items()]
    else:
        lines.append(f"  {'DROPPED':>8}  {'COALESCED':>9}  {'REPLACED':>8}  CLASS")
        for cls in classes:
            d, n, r = (counts.get(cls, 0) for counts in kinds)
            lines.append(f"  {d:>8}  {n:>9}  {r:>8}  {escape(cls)}")
    corrupt = f", {figures.corrupt} corrupt (see uniqjob locks)" if figures.corrupt else ""
    waiting = f", {figures.pending} with a pending call" if figures.pending else ""
    waiting += f", {figures.debouncing} debouncing" if figures.debouncing else ""
    lines.append(
        f"locks: {figures.queued} queued, {figures.running} running, {figures.orphaned} orphaned"
        f"{waiting}{corrupt}"
    )
    c = figures.concurrency
    oldest = f", the oldest waiting {c.oldest_wait:.1f}s" if c.oldest_wait is not None else ""
    lines.append(
        f"concurrency: {c.keys} key(s), {c.slots_held} slot(s) held ({c.stale_slots} stale), "
        f"{c.keys_at_limit} at their limit, {c.parked} job(s) parked{oldest}"
    )
    return "\n".join(lines) + "\n"
