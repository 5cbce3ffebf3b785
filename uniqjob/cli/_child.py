"""Run a command under a supervisor that governs its whole process tree, and watch it.

The command is started through ``_supervisor.py``, a small Python process that
stays in our process group and runs the command as the leader of a process
group of its own: signals we pass on, ``--kill-after``, a lost lock and our own
death (Linux ``PR_SET_PDEATHSIG``) reach every process the command started that
stays in that group, not just the first. A ``preexec_fn`` could not set this up
safely once threads exist, and the heartbeat is a thread. So a ``uniqjob run``
killed with SIGKILL takes the command's pipelines and children with it: the next
cron tick never overlaps a command that runs on without its lock.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from ..heartbeat import TAKEN, TAKEN_TEXT
from . import _supervisor
from ._common import say
from ._supervisor import FORWARDED, KILL_ALL

if TYPE_CHECKING:
    from ..joblock import JobLock

__all__ = ["Child", "SignalWaiter", "signal_waiter", "spawn"]

_SI_KERNEL = 0x80  # Linux si_code of a signal the kernel sent, e.g. ^C from the terminal
_TICK = 0.25  # how often a running command's lock is checked for loss
# SIGKILL is sent this long before the lease could lapse: the supervisor relays it to the group.
_KILL_LEAD = 0.05


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` (PATH lookup, no shell) in ``env`` under the supervisor, with our stdio and fds."""
    # -I -S: no site-packages and no PYTHON* variables: a fast start that runs our file only.
    launcher = [sys.executable, "-I", "-S", _supervisor_file(), str(os.getpid())]
    # close_fds=False: only fds the caller made inheritable pass (ours are not, PEP 446),
    # so a wrapped command sees exactly what it would see without the wrapper.
    return subprocess.Popen([*launcher, *argv], close_fds=False, env=env)


def _supervisor_file() -> str:
    """The supervisor's compiled file where it is current, else its source.

    A script run from its source is compiled on every start; Python runs a
    ``.pyc`` as well. The import system just read or wrote it (``__cached__``),
    but it leaves a stale one be where it cannot write: so it is used only when
    its header (PEP 552: magic, flags 0, the source's mtime and size) matches.
    """
    source = _supervisor.__file__
    cached = getattr(_supervisor, "__cached__", None)
    if not cached:
        return source
    try:
        with open(cached, "rb") as file:
            header = file.read(16)
        info = os.stat(source)
    except OSError:
        return source
    from importlib.util import MAGIC_NUMBER

    expected = (0, int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)
    fields = tuple(int.from_bytes(header[i : i + 4], "little") for i in (4, 8, 12))
    return cached if header[:4] == MAGIC_NUMBER and fields == expected else source


class SignalWaiter:
    """Collects the signals we forward (and SIGCHLD) and waits for the next one, with a timeout."""

    def wait(self, timeout: float) -> int | None:
        """Return a signal to forward; None on timeout or when only a child changed state."""
        raise NotImplementedError

    def close(self) -> None:
        """Give the signals back to their previous handling."""


class _MaskWaiter(SignalWaiter):
    """Block the signals and take them with ``sigtimedwait``: nothing runs in a handler.

    ``siginfo`` tells a terminal's ^C (sent by the kernel to the whole
    foreground process group, so the supervisor, which shares our group, got it
    too and passes it on) from a ``kill`` aimed at us, which only we got; only
    the latter is passed on.
    """

    def __init__(self) -> None:
        self._set = {*FORWARDED, signal.SIGCHLD}
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._set)

    def wait(self, timeout: float) -> int | None:
        info = signal.sigtimedwait(self._set, max(timeout, 0.0))
        if info is None or info.si_signo == signal.SIGCHLD or info.si_code == _SI_KERNEL:
            return None
        if info.si_signo not in self._set:
            return None  # resumed after SIGSTOP, sigtimedwait may hand back a siginfo never filled in
        return info.si_signo

    def close(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


class _PipeWaiter(SignalWaiter):
    """Where ``sigtimedwait`` is missing (macOS): handlers write to a wakeup pipe we select on."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w)
        self._pending: list[int] = []
        self._old: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        for signum in (*FORWARDED, signal.SIGCHLD):
            self._old[signum] = signal.signal(signum, _noop)

    def wait(self, timeout: float) -> int | None:
        if not self._pending:
            readable, _, _ = select.select([self._r], [], [], max(timeout, 0.0))
            if readable:
                with contextlib.suppress(BlockingIOError):
                    self._pending += [n for n in os.read(self._r, 512) if n != signal.SIGCHLD]
        return self._pending.pop(0) if self._pending else None

    def close(self) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._r)
        os.close(self._w)


def _noop(signum: int, frame: FrameType | None) -> None:
    """A handler that only lets the wakeup fd record the signal."""


def signal_waiter() -> contextlib.closing[SignalWaiter]:
    """Take over the forwarded signals (main thread, before any thread starts) until the block ends."""
    return contextlib.closing(_MaskWaiter() if hasattr(signal, "sigtimedwait") else _PipeWaiter())


class Child:
    """A running command (its supervisor, in ``proc``) under ``lock``, and the limits it runs under.

    Once ``lock`` is lost, or presumed lost, the command must not run on
    unlocked: its whole process group is stopped, SIGTERM and then SIGKILL
    after ``grace``, but no later than the lease could lapse on the store (a
    lease after the last renewal it confirmed), whatever ``grace`` says. The
    lock is checked every quarter second, and when it is to be presumed lost
    unless a renewal is confirmed first. Every signal goes to the command's
    whole process group, through the supervisor.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], lock: JobLock, name: str, kill_after: float | None, grace: float
    ) -> None:
        # A plain class, not a dataclass: making a dataclass costs every `uniqjob run` its start-up.
        self.proc = proc
        self.lock = lock
        self.name = name
        self.kill_after = kill_after
        self.grace = grace
        #: A signal passed on to the command, or --kill-after's SIGTERM: it was stopped, not left to end.
        self.stopped = False

    def _lapse(self) -> float:
        """When, on the heartbeat's (monotonic) clock, the lease could lapse on the store: +inf if unknown."""
        beat = self.lock.beat
        return math.inf if beat is None or beat.lease is None else beat.confirmed + beat.lease

    def _presume_at(self) -> float:
        """When the lock is presumed lost unless a renewal is confirmed first: +inf if never."""
        beat = self.lock.beat
        return beat.deadline if beat is not None else math.inf

    def supervise(self, waiter: SignalWaiter) -> int:
        """Forward signals, enforce the deadline, stop on a lost lock; return the command's exit status."""
        proc = self.proc
        deadline = time.monotonic() + self.kill_after if self.kill_after is not None else math.inf
        hard_kill_at = math.inf
        stopping = quiet_kill = lost = False
        while True:
            status = proc.poll()
            if status is not None:
                return 128 - status if status < 0 else status  # 128+N: it died of signal N
            now = time.monotonic()
            if not lost and self.lock.lost:
                # Also after --kill-after's SIGTERM: the SIGKILL must then come before the lease lapses.
                # One line, and the SIGKILL goes unannounced: the why is what matters.
                say(f"{_why(self.lock)}; stopping {self.name}")
                hard_kill_at = min(hard_kill_at, now + self.grace, self._lapse() - _KILL_LEAD)
                quiet_kill = lost = True
                if not stopping:
                    proc.terminate()
                    stopping = True
            elif not stopping and now >= deadline:
                say(f"{self.name} ran longer than {self.kill_after:g}s: sending SIGTERM")
                hard_kill_at = now + self.grace
                proc.terminate()
                stopping = self.stopped = True
            if now >= hard_kill_at:
                if not quiet_kill:
                    say(f"{self.name} still running {self.grace:g}s after SIGTERM: sending SIGKILL")
                proc.send_signal(KILL_ALL)  # SIGKILL would end the supervisor, not the group
                hard_kill_at = math.inf
            wake = min(now + _TICK, deadline if not stopping else hard_kill_at)
            if not lost and now < self._presume_at() < wake:
                wake = self._presume_at()
            signum = waiter.wait(wake - now)
            if signum is not None:
                self.stopped = True
                proc.send_signal(signum)  # a no-op once the child has been reaped


def _why(lock: JobLock) -> str:
    """One line on why the lock is lost, for stderr."""
    beat = lock.beat
    if beat is None or beat.reason in ("", TAKEN) or beat.lease is None:
        asker = _stop_asked_by(lock)
        if asker:
            return f"the run on {asker} asked to take over {lock.key!r} (--overlap terminate-other)"
        return f"lost the lock {lock.key!r}: {TAKEN_TEXT}"
    unconfirmed = beat.lost_at - beat.confirmed
    return (
        f"lock {lock.key!r} presumed lost: the store confirmed no renewal for {unconfirmed:.1f}s"
        f" of its {beat.lease:g}s lease"
    )


def _stop_asked_by(lock: JobLock) -> str:
    """Who asked this run to stop (``host:pid``), if that is why its renewal failed; "" if not, or unknown."""
    try:
        run = lock.backend.read(lock.key).run
    except Exception:  # the store failed: the loss is said without the why
        return ""
    return run.stop if run is not None and run.token == lock.token else ""
