"""``uniqjob run``: run a command at most once at a time, under a run lock with heartbeat."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._ticks import MAX_SKEW, parse_period, tick_of
from .._undo import undos
from ..errors import BackendError, ConfigurationError
from ..heartbeat import LOST_RECORD
from ..joblock import JobLock
from ..keys import make_key
from ..locks import Holder, LockState, QueueMeta, holder_is_dead, local_holder, orphaned
from ..settings import MAX_RUN_LEASE, MIN_RUN_LEASE
from ..stores import _log
from ._child import Child, SignalWaiter, signal_waiter, spawn
from ._common import (
    EX_TEMPFAIL,
    SubParsers,
    UsageError,
    add_quiet_option,
    add_url_option,
    exit_code,
    lease,
    open_backend,
    positive_seconds,
    say,
    seconds,
    wait_seconds,
)

if TYPE_CHECKING:
    import logging

    from ..stores.base import Overlap, OverlapMode

__all__ = ["RUN_JOB", "add_run_parser", "command_key"]

#: The job name of ``uniqjob run`` locks: the ``class`` that ``uniqjob locks`` shows.
RUN_JOB = "uniqjob.cli.run"

#: What ``--overlap`` takes: what a run does when another run holds its key.
OVERLAPS = ("skip", "buffer-one", "terminate-other")

_EXAMPLES = """\
The default key is derived from the command and its arguments exactly as
given (not the working directory or environment): the same command line is the
same key, on every host that uses the same store.

The command gets UNIQJOB_KEY (its lock key) and UNIQJOB_FENCE (the lock's fence: an
integer greater than that of any earlier run of the key) in its environment. If
the lock is lost, or presumed lost because the store confirmed no renewal for
two thirds of --lease, the command's process group gets SIGTERM, and SIGKILL
before the lease could lapse on the store (sooner than --grace if need be).

exit status:
  the command's own status; 128+N if it died of signal N (also when stopped on a lost lock);
  75 (or --conflict-exit) if the lock is held elsewhere; 0 if coalesced into a run that waits
  (--overlap buffer-one); 64 bad usage;
  65 a lock record that cannot be read; 69 lock store unreachable; 70 internal error;
  78 bad store URL or settings (a password the server wants, a database it lacks);
  126/127 command not executable/found

quiet: a lock held elsewhere is one line on stderr, unless --quiet or --conflict-exit 0
(cron mails whatever a job prints: a busy tick then sends none). Errors are always said.

examples:
  # crontab: a nightly backup that never overlaps itself, on any host
  0 2 * * *  UNIQJOB_URL=redis://redis.internal:6379/0 uniqjob run -- /usr/local/bin/backup --full

  # a tick that finds the previous run busy runs once after it; the ticks meanwhile exit 0
  */5 * * * *  uniqjob run --overlap buffer-one -- ./sync.sh

  # wait up to 5 minutes for the previous run, stop it after 2 hours
  uniqjob run --wait 300 --kill-after 7200 --key reports -- ./make-reports.sh

  # the same crontab on every host: one host runs each 5-minute tick, the others exit 75
  # (the tick is the store's clock; a host whose clock is ahead of the store's by up to a
  # tenth of DURATION, at most {skew:g}s, still counts into the tick it meant)
  */5 * * * *  UNIQJOB_URL=redis://redis.internal:6379/0 uniqjob run --once-per 5m -- ./sync.sh
"""


def add_run_parser(subparsers: SubParsers) -> None:
    """Register ``uniqjob run``."""
    parser = subparsers.add_parser(
        "run",
        help="run a command unless another run of it holds its lock",
        description="Run CMD under a lock. If another `uniqjob run` of the same key is running\n"
        "(on this host, or on any host that shares the store), exit at once, or --wait.",
        epilog=_EXAMPLES.format(skew=MAX_SKEW),
        usage="%(prog)s [options] -- CMD [ARG...]",
    )
    parser.add_argument("--key", help="lock key (default: derived from CMD and its arguments)")
    add_url_option(parser)
    parser.add_argument(
        "--lease",
        type=lease,
        default=30.0,
        metavar="SECONDS",
        help=f"run lock lease: how soon other hosts may take over if this one dies ({MIN_RUN_LEASE:g} to"
        f" {MAX_RUN_LEASE:g}; default: 30)",
    )
    parser.add_argument(
        "--wait",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the lock instead of giving up at once (inf: as long as it takes)",
    )
    parser.add_argument(
        "--conflict-exit",
        type=exit_code,
        default=EX_TEMPFAIL,
        metavar="CODE",
        help="exit status when the lock is held elsewhere (default: 75; 0 also says nothing)",
    )
    add_quiet_option(parser)
    parser.add_argument(
        "--once-per",
        type=_period,
        metavar="DURATION",
        help="run once per tick of DURATION (30s, 5m, 1h, 1d) of the store's clock, on all hosts together:"
        " the tick's lock is kept until the tick ends",
    )
    parser.add_argument(
        "--overlap",
        choices=OVERLAPS,
        default="skip",
        help="when another run holds the key: skip this one (the default), buffer-one (run once after it;"
        " runs meanwhile exit 0 at once) or terminate-other (stop it, SIGTERM then SIGKILL after its"
        " --grace, on any host, then run)",
    )
    parser.add_argument(
        "--kill-after",
        type=positive_seconds,
        metavar="SECONDS",
        help="send CMD (its whole process group) SIGTERM if it runs longer, then SIGKILL after --grace",
    )
    parser.add_argument(
        "--grace",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when stopping CMD (default: 10)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments"
    )
    parser.set_defaults(handler=run_command)


def command_key(argv: Sequence[str]) -> str:
    """Return the default lock key of a command line: the same argv always gives the same key."""
    return make_key(RUN_JOB, {"argv": list(argv)})


def run_command(args: argparse.Namespace) -> int:
    """Handle ``uniqjob run``."""
    argv = _checked_command(args)
    overlap: str = args.overlap
    key = args.key if args.key is not None else command_key(argv)
    name = _preview(shlex.join(argv))
    # Signals are taken over before the lock, so one that arrives while we wait
    # or start means "do not run": nothing is started and the lock goes back.
    # It must also precede the heartbeat thread, which inherits the signal mask:
    # a SIGTERM delivered to that thread instead would kill us outright.
    with signal_waiter() as waiter:
        backend = open_backend(args.url)
        period: float | None = args.once_per
        # --once-per: the tick's lock, kept (queued) after the run until the tick ends, so
        # every other host that fires in this tick meets it.
        tick = tick_of(backend, key, period) if period is not None else None
        key = tick.key if tick is not None else key
        lock = JobLock(
            backend,
            key,
            lease=args.lease,
            ttl=tick.ttl if tick is not None else None,
            meta=QueueMeta(RUN_JOB, name),
            strategy="until_expired" if tick is not None else "until_executed",
        )
        if overlap == "skip":
            got, signum = _acquire(lock, args.wait, waiter, run=period is None)
        else:
            got, signum = _take_over(lock, overlap, waiter, quiet=args.quiet)
            if not got and signum is None:  # coalesced into the run already waiting
                if not args.quiet:
                    say(f"another run waits to run after the one holding {key!r}: not running {name} again")
                return 0
        if signum is not None:
            return 128 + signum
        if not got:
            if not args.quiet and args.conflict_exit != 0:  # else a busy tick by choice: cron mails nothing
                say(_conflict_message(key, lock.conflict, name, period))
            return int(args.conflict_exit)
        if period is not None:
            lock.start()  # the run lock; the tick's queue lock stays when it goes
        status, owed = _run_locked(lock, argv, name, args, waiter, follow=period is None)
        # The run owed to the runs that coalesced behind ours (see _follow), owed again if
        # runs coalesced behind it too. Our exit status: the first that is not 0.
        while owed != "free":
            ours = lock.token
            lock = JobLock(backend, key, lease=args.lease, meta=QueueMeta(RUN_JOB, name))
            got, signum = _follow(lock, ours, owed, waiter)
            if signum is not None:
                return 128 + signum
            if not got:
                break  # a run started after ours: it ran for them
            if not args.quiet:
                gone = "the run that was to run after ours is gone"
                say(f"{gone}: running {name} again for the runs it stood for")
            again, owed = _run_locked(lock, argv, name, args, waiter, follow=True)
            status = status or again
        return status


def _checked_command(args: argparse.Namespace) -> list[str]:
    """The command to run, once the options are found to make sense together (else UsageError)."""
    argv: list[str] = args.command
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given: uniqjob run [options] -- CMD [ARG...]")
    if args.key is not None:
        if not args.key.strip():
            raise UsageError("--key must not be empty")
        try:
            args.key.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (bytes of argv that are not UTF-8): no store can key it
            raise UsageError("--key must be text (UTF-8): it holds bytes that are not") from None
    if args.once_per is not None and args.wait:
        # The tick's lock lasts until the tick ends: a waiter would only run the tick again.
        raise UsageError("--wait has no use with --once-per: each tick runs once, on one host")
    overlap: str = args.overlap
    if overlap != "skip" and args.once_per is not None:
        raise UsageError(f"--overlap {overlap} has no use with --once-per: each tick runs once, on one host")
    if overlap != "skip" and args.wait:
        raise UsageError(
            f"--overlap {overlap} waits as long as the other run holds the key: leave out --wait"
        )
    return argv


def _run_locked(
    lock: JobLock, argv: list[str], name: str, args: argparse.Namespace, waiter: SignalWaiter, *, follow: bool
) -> tuple[int, Overlap]:
    """Run the command under ``lock``, taken; its exit status, and what it owes (see _follow).

    ``follow``: once the command ended by itself with the lock held, ask the store whether runs
    coalesced into a pending run meanwhile (``Backend.overlap``'s ``"follow"``); "free" if not.
    """
    with _loss_said_by_us(), lock.running(started=True):
        signum = waiter.wait(0)
        if signum is not None:
            return 128 + signum, "free"
        child = Child(spawn(argv, _command_env(lock)), lock, name, args.kill_after, args.grace)
        status = child.supervise(waiter)
        if not follow or child.stopped or lock.lost:
            return status, "free"
        me = local_holder()
        try:
            return status, lock.backend.overlap(lock.key, lock.token, "follow", lease=lock.lease, holder=me)
        except BackendError:  # the run is over: its status matters more than the runs behind it
            return status, "free"


def _follow(lock: JobLock, ours: str, owed: Overlap, waiter: SignalWaiter) -> tuple[bool, int | None]:
    """Give the runs coalesced behind our run (token ``ours``) the run they are owed; (taken, signal).

    They exited at once, counting on the pending run (``--overlap buffer-one``); our run, which held
    the key, keeps their promise: while the pending run waits (``owed`` "coalesced": alive, by its
    place, and not dead on this host) we watch it take the key ("free"); once it is gone (withdrawn,
    stopped by a signal; lapsed; its pid dead here), or if none waited ("pending"), we take ``lock``
    (True) and run once more, unless a run took the key meanwhile: it started after ours (False).
    """
    backend, key, delay = lock.backend, lock.key, 0.05
    while owed != "free":
        if owed == "coalesced" and _gone(backend.read(key).pending_run):
            owed = "pending"
        if owed == "pending":
            if lock.acquire(run=True):
                return True, None
            if lock.conflict is not None and lock.conflict.run is not None:
                return False, None
        signum = waiter.wait(min(lock.lease / 3, delay))
        if signum is not None:
            return False, signum
        delay = min(delay * 2, 1.0)
        owed = backend.overlap(key, ours, "follow", lease=lock.lease, holder=local_holder())
    return False, None


def _command_env(lock: JobLock) -> dict[str, str]:
    """Our environment, plus the lock's key and fence for the command (a fence only once issued)."""
    env = dict(os.environ)
    env["UNIQJOB_KEY"] = lock.key
    env.pop("UNIQJOB_FENCE", None)  # an outer run's fence is not this lock's
    if lock.fence is not None:
        env["UNIQJOB_FENCE"] = str(lock.fence)
    return env


def _loss_said_by_us() -> contextlib.AbstractContextManager[None]:
    """Leave out the heartbeat's own report of a lost lock: the run says it, with what it does about it."""

    def not_loss(record: logging.LogRecord) -> bool:
        return not getattr(record, LOST_RECORD, False)

    def setup() -> Callable[[], None]:
        import logging

        logger = logging.getLogger("uniqjob.heartbeat")
        logger.addFilter(not_loss)
        return lambda: logger.removeFilter(not_loss)

    return _log.configured(setup)  # when logging is used: a run that logs nothing never loads it


def _acquire(lock: JobLock, wait: float, waiter: SignalWaiter, *, run: bool) -> tuple[bool, int | None]:
    """Take the lock (``run``: the run lock with it), polling with capped backoff for up to ``wait`` seconds.

    Returns (taken, signal): a forwarded signal during the wait ends it untaken.
    """
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        if lock.acquire(run=run):
            return True, None
        left = deadline - time.monotonic()
        if left <= 0:
            return False, None
        signum = waiter.wait(min(left, _jittered(delay)))
        if signum is not None:
            return False, signum
        delay = min(delay * 2, 1.0)


def _take_over(lock: JobLock, overlap: str, waiter: SignalWaiter, *, quiet: bool) -> tuple[bool, int | None]:
    """``--overlap buffer-one`` / ``terminate-other``: take the lock once its holder ends, or is stopped.

    Returns (taken, signal); (False, None): coalesced into the run already waiting (buffer-one).
    Each decision (to be the one pending run, to ask the holder to stop) is the store's, in one
    atomic step (``Backend.overlap``). A pending run renews its place at each look, a third of its
    lease apart at most; a stop request reaches the holder at its next renewal, which fails: it stops
    its command as on a lost lock, and its lease lapses at the latest where it was.
    """
    backend, key, token, me = lock.backend, lock.key, lock.token, local_holder()
    buffer = overlap == "buffer-one"
    delay, asked, waited = 0.05, False, False

    def withdraw_place() -> bool:
        return bool(backend.overlap(key, token, "withdraw", lease=lock.lease, holder=me))

    def withdraw() -> None:  # a run that waited drops its place once it has the key, or gives up
        if waited:
            try:
                withdraw_place()
            except BackendError:  # made again until the store answers (twice changes nothing)
                undos.add(withdraw_place, f"the pending run of {key!r}", ())

    while True:
        if not buffer and lock.acquire(run=True):
            return True, None
        mode: OverlapMode = "buffer" if buffer else "terminate"
        verdict = backend.overlap(key, token, mode, lease=lock.lease, holder=me)
        if verdict == "coalesced":
            return False, None
        if verdict == "free":
            if buffer and lock.acquire(run=True):
                withdraw()  # else its place, kept until its lease ends, would swallow the runs after it
                return True, None
            continue  # taken meanwhile by another run: look again
        waited = waited or verdict == "pending"
        if verdict == "pending" and orphaned(backend.read(key)) and lock.acquire(run=True):
            withdraw()  # its holder is provably dead (the orphan rule): the key is ours at once
            return True, None
        if verdict == "stopping" and not asked and not quiet:
            say(f"asked the run holding {key!r} to stop (--overlap terminate-other); waiting for it to end")
        asked = asked or verdict == "stopping"
        signum = waiter.wait(min(lock.lease / 3, _jittered(delay)))
        if signum is not None:
            withdraw()
            return False, signum
        delay = min(delay * 2, 1.0)


def _jittered(delay: float) -> float:
    """``delay``, give or take a fifth: many waiters then do not poll in step after a long run ends."""
    import random  # here: a run that waits for nobody need not load it

    return delay * random.uniform(0.8, 1.2)


def _gone(pending_run: str) -> bool:
    """Whether the pending run ``host:pid`` is provably dead: on this host, its pid gone (or reused)."""
    host, _, pid = pending_run.rpartition(":")
    me = local_holder()
    return host == me.host and pid.isdigit() and holder_is_dead(Holder(host, me.node, int(pid)), me)


def _period(text: str) -> float:
    """argparse type: a ``--once-per`` period."""
    try:
        value = parse_period(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a tick must be at least 1s, got {text!r}")
    return value


def _conflict_message(key: str, state: LockState | None, name: str, period: float | None) -> str:
    """One line naming the key and its holder (or its ``--once-per`` tick), for cron mail."""
    if state is None:  # the lock kept changing hands while we tried
        return f"lock {key!r} is busy; not running: {name}"
    if state.run is not None:
        run = state.run
        holder = f"pid {run.holder.pid} on {run.holder.host}, running for {state.now - run.started:.1f}s"
    elif state.queue is not None and period is not None:
        return f"already run in this {period:g}s tick (lock {key!r}); not running: {name}"
    elif state.queue is not None:
        holder = f"a {state.queue.state} job, for {state.now - state.queue.since:.1f}s"
    else:
        holder = "another holder"
    return f"lock {key!r} is held by {holder}; not running: {name}"


def _preview(text: str) -> str:
    """The command line on one line (for messages and lock listings), at most 200 characters."""
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= 200 else text[:197] + "..."
