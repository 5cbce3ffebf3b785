"""The process between ``uniqjob run`` and its command: it keeps the command's whole process tree in reach.

``uniqjob run`` starts it as a script, ``python -I -S _supervisor.py WRAPPER_PID CMD [ARG...]``
(standard library only, so it starts in milliseconds). It stays in the wrapper's
process group, which is the terminal's job, and runs the command as the leader of
a process group of its own, so one ``killpg`` reaches everything the command
starts (pipelines, scripts that fork) unless a process leaves that group itself
(``setsid``, ``setpgid``, daemons). Then it

- passes the signals it gets on to the command's group: those the wrapper
  forwards, and the terminal's while our job still has the terminal;
- kills the group with SIGKILL on ``KILL_ALL``, which the kernel sends when the
  wrapper dies (Linux ``PR_SET_PDEATHSIG``: SIGKILL itself cannot be caught, and
  would leave the group running) and the wrapper sends when ``--grace`` is over;
- hands the terminal to the command's group while our job is in the foreground,
  as a shell does, so the command can read it and gets ^C from it; on ^Z it
  stops our job and hands the command the terminal again when the shell resumes it;
- exits with the command's status (128+N for signal N) once the command has
  exited and nothing is left in its group (Linux), so the lock is held until then.
"""

from __future__ import annotations

import os
import signal
import sys

# Names for the type checker only: importing typing would add half again to our start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import NoReturn, TypeAlias

    _Prctl: TypeAlias = Callable[[int, int], int]

__all__ = ["FORWARDED", "KILL_ALL", "main"]

#: Signals passed on to the command's process group.
FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
)

#: "End everything now": SIGKILL to the command's whole process group.
KILL_ALL = signal.SIGALRM

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_DRAIN_POLL = 0.1  # a safety net: the group's last process usually reports to us (we are its subreaper)


def main(argv: Sequence[str]) -> NoReturn:
    """Run the command ``argv[1:]`` for the wrapper whose pid is ``argv[0]``; exit with its status."""
    parent, command = int(argv[0]), list(argv[1:])
    watched = {*FORWARDED, KILL_ALL, signal.SIGCHLD, signal.SIGCONT}
    # Signals that come before the command exists wait, and are passed on once it does.
    # SIGTTOU is blocked so we may hand the terminal around from a background group.
    signal.pthread_sigmask(signal.SIG_BLOCK, {*watched, signal.SIGTTOU})
    prctl = _prctl()
    prctl(_PR_SET_PDEATHSIG, KILL_ALL)
    # As the subreaper, we inherit the command's orphans: we reap them, and learn when they end.
    prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)  # the wrapper died before its death signal was armed
    job = os.getpgrp()
    tty = _controlling_terminal()
    pid = _start(command, job, tty, prctl)
    # We wait on a group that is empty only once the command's last process is gone, which
    # we cannot see without sigtimedwait (macOS): there we end with the command itself.
    drain = hasattr(signal, "sigtimedwait")
    flags = os.WNOHANG | (os.WUNTRACED if tty is not None else 0)
    status: int | None = None
    while status is None or (drain and _alive(pid)):
        signum = _next_signal(watched, None if status is None else _DRAIN_POLL)
        if signum == KILL_ALL:
            _quietly(os.killpg, pid, signal.SIGKILL)
        elif signum == signal.SIGCONT:  # the shell resumed our job: with the terminal (fg) or without (bg)
            _hand_terminal(tty, job, pid)
            _quietly(os.killpg, pid, signal.SIGCONT)
        elif signum is not None and signum != signal.SIGCHLD:
            _quietly(os.killpg, pid, signum)
        for child, child_status in _reap(flags):
            if child != pid:
                continue  # an orphan of the command's, adopted by us as its subreaper
            if os.WIFSTOPPED(child_status):
                _suspend(tty, job, pid)
            else:
                status = child_status
    _hand_terminal(tty, pid, job)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _prctl() -> _Prctl:
    """Linux ``prctl(2)`` through ctypes; a no-op elsewhere, or where the C library does not have it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            call = ctypes.CDLL(None).prctl
        except (OSError, AttributeError):
            pass
        else:
            return lambda option, arg: int(call(option, arg, 0, 0, 0))
    return lambda option, arg: -1


def _controlling_terminal() -> int | None:
    """Our controlling terminal, if we have one (never under cron); it is not inherited by the command."""
    try:
        return os.open("/dev/tty", os.O_RDWR)
    except OSError:
        return None


def _start(argv: list[str], job: int, tty: int | None, prctl: _Prctl) -> int:
    """Fork the command as the leader of a new process group, with the terminal if our job has it."""
    pid = os.fork()
    if pid == 0:
        try:
            _exec(argv, job, tty, prctl)
        except BaseException as exc:  # never run on as a second supervisor
            os.write(2, f"uniqjob: cannot start {argv[0]!r}: {exc!r}\n".encode(errors="replace"))
        os._exit(126)
    # Done in both processes, so the group exists before we pass on any signal (an error
    # here means the child did it first and may even have exec'd already).
    _quietly(os.setpgid, pid, pid)
    return pid


def _exec(argv: list[str], job: int, tty: int | None, prctl: _Prctl) -> NoReturn:
    """In the forked child: take the terminal before the command can read it, restore signals, exec."""
    os.setpgid(0, 0)
    _hand_terminal(tty, job, os.getpid())
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # should we be SIGKILLed ourselves, the command goes too
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored across
    # execve: the command would not die quietly when its reader goes away (`cmd | head`).
    # SIGINT goes back to the default unless it was ignored already (a background job's ^C).
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"uniqjob: cannot run {argv[0]!r}: {exc.strerror or exc}\n".encode(errors="replace"))
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _next_signal(watched: set[int], timeout: float | None) -> int | None:
    """The next watched signal; None if ``timeout`` seconds pass first."""
    if timeout is None:
        return signal.sigwait(watched)
    info = signal.sigtimedwait(watched, timeout)
    return None if info is None else info.si_signo


def _reap(flags: int) -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child that has changed state, without blocking."""
    while True:
        try:
            pid, status = os.waitpid(-1, flags)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _quietly(call: Callable[[int, int], None], *args: int) -> None:
    """Call ``call(*args)``, ignoring an OSError (``contextlib`` costs start-up time)."""
    try:  # noqa: SIM105
        call(*args)
    except OSError:
        pass


def _alive(pgid: int) -> bool:
    """Whether any process (a zombie counts) is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone is there, just not ours to signal (a set-user-ID program)
    return True


def _hand_terminal(tty: int | None, owner: int, to: int) -> None:
    """Make ``to`` the terminal's foreground process group, if ``owner`` is (what a shell does for a job)."""
    if tty is None:
        return
    try:
        if os.tcgetpgrp(tty) == owner:
            os.tcsetpgrp(tty, to)
    except OSError:
        pass  # the terminal hung up: there is nobody to hand it to


def _suspend(tty: int | None, job: int, pid: int) -> None:
    """The command stopped (^Z, or it read the terminal in the background): stop our whole job.

    A shell waits for the wrapper, not for the command, so it only sees the job
    stop if we stop it. It resumes us with ``fg`` or ``bg``; if no shell can (an
    orphaned process group, which ignores SIGTSTP) we go on at once.
    """
    _hand_terminal(tty, pid, job)
    os.kill(0, signal.SIGTSTP)
    _hand_terminal(tty, job, pid)
    _quietly(os.killpg, pid, signal.SIGCONT)


if __name__ == "__main__":
    main(sys.argv[1:])
