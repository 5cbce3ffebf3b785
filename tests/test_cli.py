"""The ``uniqjob`` command, run for real in subprocesses: ``run``, errors, exit codes, signals.

Commands are small Python snippets that report through marker files, so no
test sleeps for a guessed time: each waits (bounded) for what it needs to see.
"""

from __future__ import annotations

import itertools
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SHARED_STORES, store_url
from tests.integration_workers import alive
from uniqjob.cli import main
from uniqjob.cli._run import command_key
from uniqjob.config import backend_from_url
from uniqjob.stores.base import Backend

PY = sys.executable
UNIQJOB = (PY, "-m", "uniqjob")
LINUX = sys.platform.startswith("linux")

# Holds its lock until the file argv[2] exists; writes its pid to argv[1] once running.
HOLD = """\
import os, sys, time
ready, go = sys.argv[1], sys.argv[2]
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
"""

# Counts signal argv[3] after writing argv[1]; exits 10 + the count, 0.3s after the first.
COUNT = """\
import os, signal, sys, time
n = 0
def on_signal(signum, frame):
    global n
    n += 1
signal.signal(int(sys.argv[3]), on_signal)
open(sys.argv[1], "w").close()
deadline = time.monotonic() + 20
while n == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # a duplicate delivery would land in this window
sys.exit(10 + n)
"""


def uniqjob(
    *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m uniqjob ARGS`` to completion (bounded: a hang fails the test)."""
    argv = [*UNIQJOB, *args]
    return subprocess.run(argv, input=input, env=env, capture_output=True, text=True, timeout=30, check=False)


_started: list[subprocess.Popen[str]] = []


def start(*args: str, prefix: tuple[str, ...] = UNIQJOB) -> subprocess.Popen[str]:
    """Start ``python -m uniqjob ARGS`` in the background (killed after the test if still running)."""
    proc = subprocess.Popen([*prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _started.append(proc)
    return proc


@pytest.fixture(autouse=True)
def kill_leftovers() -> Iterator[None]:
    """A failed test must not leave wrappers behind (their commands die with them)."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen[str], timeout: float = 15.0) -> tuple[int, str, str]:
    """Wait for a background command; return its status, stdout and stderr."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: it only waits to be reaped)."""
    return not alive(pid)


_markers = itertools.count()


@pytest.fixture
def marker() -> Iterator[str]:
    """Seconds to sleep that no other process has in its argv; whatever holds them dies after the test."""
    mark = f"30.{os.getpid()}{next(_markers):03d}"
    yield mark
    for pid in holding(mark):  # a failed test must not leave its grandchildren behind
        os.kill(pid, signal.SIGKILL)


def holding(mark: str) -> list[int]:
    """Pids of the live processes with ``mark`` as one of their arguments (a /proc scan)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:  # gone meanwhile
            continue
        if mark.encode() in args:
            found.append(int(entry.name))
    return found


@dataclass
class Store:
    """A lock store the command is pointed at, and the library's view of the same store."""

    url: str
    backend: Backend


@pytest.fixture(params=SHARED_STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store the command can open from another process (files, the session's redis-server), in turn."""
    url = store_url(request, tmp_path)
    backend = backend_from_url(url)
    yield Store(url, backend)
    backend.close()


class Hold:
    """A ``uniqjob run`` of HOLD, and the marker files that drive it."""

    def __init__(self, tmp_path: Path, name: str = "hold") -> None:
        self.ready = tmp_path / f"{name}.ready"
        self.go = tmp_path / f"{name}.go"
        self.argv = [PY, "-c", HOLD, str(self.ready), str(self.go)]
        self.key = command_key(self.argv)

    def start(self, *options: str) -> subprocess.Popen[str]:
        return start("run", *options, "--", *self.argv)

    def wait_running(self) -> int:
        """Wait until the command runs; return its pid."""
        wait_for(self.ready.exists, what="the held command to start")
        return int(self.ready.read_text())

    def release(self) -> None:
        self.go.touch()


# -- the command line ----------------------------------------------------------------


@pytest.mark.parametrize("sub", ["run", "locks", "release", "reap"])
def test_each_subcommand_help_shows_an_example(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([sub, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"usage: uniqjob {sub}" in out
    assert "examples:" in out and f"uniqjob {sub}" in out.split("examples:")[1]


def test_python_dash_m_and_top_level_help() -> None:
    result = uniqjob("--help")
    assert result.returncode == 0
    for sub in ("run", "locks", "release", "reap"):
        assert sub in result.stdout
    assert "examples:" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["run"],
        ["run", "--"],
        ["run", "--lease", "0", "--", "true"],
        ["run", "--lease", "-1", "--", "true"],
        ["run", "--wait", "soon", "--", "true"],
        ["run", "--kill-after", "inf", "--", "true"],
        ["run", "--conflict-exit", "256", "--", "true"],
        ["run", "--key", " ", "--", "true"],
        ["release"],
        ["locks", "--nope"],
    ],
)
def test_usage_errors_exit_64_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("uniqjob"), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["run", "--url", "foo://x", "--", "true"], {}, "unsupported lock store URL 'foo://x'"),
        (["locks"], {"UNIQJOB_URL": "bogus"}, "unsupported lock store URL 'bogus'"),
        (["run", "--url", "redis://localhost:port/0", "--", "true"], {}, "bad Redis URL"),
        (["reap", "--url", "file://remotehost/x"], {}, "bad file URL"),
        (["locks", "--url", "memory://"], {}, "needs a shared store"),
    ],
)
def test_bad_store_url_exits_78(args: list[str], env: dict[str, str], needle: str) -> None:
    result = uniqjob(*args, env={**os.environ, **env})
    assert result.returncode == 78, result.stderr
    assert needle in result.stderr
    assert result.stderr.count("\n") == 1


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nobody listens on it once the socket is closed


@pytest.mark.parametrize("sub", [["run", "--", "true"], ["locks"], ["release", "k"], ["reap"]])
@pytest.mark.slow
def test_unreachable_redis_exits_69_quickly(sub: list[str], tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    marker = tmp_path / "ran"
    argv = [*sub[:-1], "touch", str(marker)] if sub[0] == "run" else sub
    began = time.monotonic()
    result = uniqjob(*argv[:1], "--url", url, *argv[1:])
    assert result.returncode == 69, result.stderr
    assert time.monotonic() - began < 5
    assert "lock store unavailable" in result.stderr and "Connection refused" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not marker.exists()  # the command never runs without its lock


# -- run -------------------------------------------------------------------------------


def test_readme_quick_check_with_the_console_script() -> None:
    script = shutil.which("uniqjob", path=os.path.dirname(PY))
    if script is None:
        pytest.skip("the uniqjob console script is not installed next to this Python")
    # The default store: the autouse fixture points XDG_STATE_HOME at a temporary directory.
    argv = [script, "run", "--", "echo", "hello"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")


def test_two_concurrent_runs_one_runs_one_exits_75(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    first, second = hold.start("--url", store.url), hold.start("--url", store.url)
    wait_for(lambda: first.poll() is not None or second.poll() is not None, what="the loser to exit")
    loser, winner = (first, second) if first.poll() is not None else (second, first)
    status, _, err = finish(loser)
    assert status == 75
    assert hold.key in err and f"on {socket.gethostname()}" in err and "not running" in err
    assert err.count("\n") == 1
    assert f"pid {winner.pid}" in err
    hold.wait_running()
    assert winner.poll() is None
    hold.release()
    assert finish(winner)[0] == 0
    assert store.backend.read(hold.key).free


def test_conflict_exit_code_and_wait_that_times_out(tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    holder = hold.start()
    hold.wait_running()
    began = time.monotonic()
    result = uniqjob("run", "--wait", "0.4", "--conflict-exit", "0", "--", *hold.argv)
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "",
        "",
    )  # busy by choice: cron mails nothing
    assert time.monotonic() - began >= 0.4
    said = uniqjob("run", "--conflict-exit", "3", "--", *hold.argv)
    assert said.returncode == 3 and "is held by" in said.stderr
    quiet = uniqjob("run", "--quiet", "--", *hold.argv)
    assert (quiet.returncode, quiet.stderr) == (75, "")
    hold.release()
    assert finish(holder)[0] == 0


@pytest.mark.slow
def test_wait_succeeds_once_the_holder_ends(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    holder = hold.start("--url", store.url)
    hold.wait_running()
    log = tmp_path / "log"
    waiter = start(
        "run", "--url", store.url, "--key", hold.key, "--wait", "20", "--",
        PY, "-c", f"open({str(log)!r}, 'a').write('second\\n')",
    )  # fmt: skip
    time.sleep(0.3)  # the waiter is polling now; nothing may run yet
    assert waiter.poll() is None and not log.exists()
    hold.release()
    assert finish(holder)[0] == 0
    status, _, err = finish(waiter)
    assert status == 0, err
    assert log.read_text() == "second\n"


@pytest.mark.parametrize(
    ("script", "status"),
    [("exit 0", 0), ("exit 7", 7), ("exit 255", 255), ("kill -TERM $$", 143), ("kill -KILL $$", 137)],
)
def test_exit_status_passes_through(script: str, status: int) -> None:
    result = uniqjob("run", "--", "sh", "-c", script)
    assert result.returncode == status
    assert result.stderr == ""


def test_stdio_passes_through() -> None:
    code = "import sys; sys.stdout.write(sys.stdin.read().upper()); sys.stderr.write('err\\n')"
    result = uniqjob("run", "--", PY, "-c", code, input="piped in\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "PIPED IN\n", "err\n")


def test_inherited_file_descriptors_pass_through(tmp_path: Path) -> None:
    with open(tmp_path / "fd-out", "w") as out:
        fd = out.fileno()
        argv = [*UNIQJOB, "run", "--", PY, "-c", f"import os; os.write({fd}, b'via-fd\\n')"]
        result = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fd-out").read_text() == "via-fd\n"


def test_command_not_found_or_not_executable(tmp_path: Path) -> None:
    missing = uniqjob("run", "--", str(tmp_path / "no-such-command"))
    assert missing.returncode == 127 and "cannot run" in missing.stderr and "No such file" in missing.stderr
    (tmp_path / "plain").write_text("not a program\n")
    plain = uniqjob("run", "--", str(tmp_path / "plain"))
    assert plain.returncode == 126 and "Permission denied" in plain.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.slow
def test_signals_are_forwarded_once_and_the_lock_released(signum: int, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    argv = [PY, "-c", COUNT, str(ready), "-", str(int(signum))]
    proc = start("run", "--", *argv)
    wait_for(ready.exists, what="the command to install its handler")
    proc.send_signal(signum)
    status, _, err = finish(proc)
    assert status == 11, err  # the command saw the signal once, handled it, and its status came back
    assert uniqjob("release", command_key(argv)).returncode == 1  # no lock left behind


def test_forwarding_without_sigtimedwait(tmp_path: Path) -> None:
    """Where the kernel gives no sigtimedwait (macOS), handlers and a wakeup pipe do the job."""
    ready = tmp_path / "ready"
    code = "import signal; del signal.sigtimedwait; from uniqjob.cli import main; raise SystemExit(main())"
    argv = [PY, "-c", COUNT, str(ready), "-", str(int(signal.SIGTERM))]
    proc = start("run", "--", *argv, prefix=(PY, "-c", code))
    wait_for(ready.exists, what="the command to install its handler")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc)[0] == 11
    proc = start("run", "--kill-after", "0.2", "--", "sleep", "30", prefix=(PY, "-c", code))
    assert finish(proc)[0] == 143


# ^C at a terminal reaches the whole foreground process group: the command has it already.
_CONTROLLING_TTY = """\
import fcntl, os, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


@pytest.mark.skipif(not LINUX, reason="terminal signals are told apart by Linux siginfo")
def test_terminal_interrupt_reaches_the_command_once(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [PY, "-c", _CONTROLLING_TTY, "-m", "uniqjob", "run", "--",
             PY, "-c", COUNT, str(ready), "-", str(int(signal.SIGINT))],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        wait_for(ready.exists, what="the command to install its handler")
        os.write(master, b"\x03")
        assert proc.wait(timeout=15) == 11  # once from the terminal, not again from the wrapper
    finally:
        os.close(master)


@pytest.mark.slow
def test_kill_after_terminates_then_kills(tmp_path: Path) -> None:
    began = time.monotonic()
    result = uniqjob("run", "--kill-after", "0.3", "--", "sleep", "30")
    assert result.returncode == 143 and "ran longer than 0.3s" in result.stderr
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
    result = uniqjob("run", "--kill-after", "0.3", "--grace", "0.3", "--", PY, "-c", stubborn)
    assert result.returncode == 137 and "sending SIGKILL" in result.stderr
    assert time.monotonic() - began < 10


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.slow
def test_sigkill_of_the_wrapper_kills_the_command_and_frees_the_lock(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", store.url, "--key", "nightly")
    child = hold.wait_running()
    wrapper.kill()
    wrapper.wait(timeout=10)
    wait_for(lambda: process_gone(child), what="the command to die with its wrapper")
    began = time.monotonic()
    result = uniqjob("run", "--url", store.url, "--key", "nightly", "--", "echo", "next")
    assert (result.returncode, result.stdout) == (0, "next\n"), result.stderr
    assert "reclaiming orphaned lock nightly: its holder is dead (it was running as pid" in result.stderr
    assert "{" not in result.stderr  # a sentence, not a dict
    assert time.monotonic() - began < 5  # same host: no waiting for the lease
    assert store.backend.read("nightly").free


def test_a_lost_lock_stops_the_command(store: Store, tmp_path: Path) -> None:
    hold = Hold(tmp_path)
    wrapper = hold.start("--url", store.url, "--lease", "1")
    hold.wait_running()
    assert uniqjob("release", "--url", store.url, "--force", hold.key).returncode == 0
    status, _, err = finish(wrapper)
    assert status == 143
    assert (
        f"lost the lock {hold.key!r}: the store no longer holds it for this holder (released by force" in err
    )
    assert "another holder" not in err  # nobody took it over: it was removed


# -- the command's whole process tree: pipelines, scripts that fork ------------------------

# Ignores SIGTERM; creates the file argv[1], then sleeps argv[2] seconds.
STUBBORN = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").close()
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.slow
def test_kill_after_stops_the_whole_pipeline_and_the_next_run_does_not_overlap(marker: str) -> None:
    argv = ("run", "--kill-after", "0.5", "--", "sh", "-c", f"sleep {marker} | sleep {marker}")
    for _ in range(2):  # the second run gets the lock, and finds nothing of the first still running
        assert holding(marker) == []
        proc = start(*argv)
        wait_for(lambda: len(holding(marker)) == 2, what="both sides of the pipeline to start")
        status, _, err = finish(proc)
        assert status == 143 and "ran longer than 0.5s" in err, err
        assert holding(marker) == []  # gone when uniqjob returns, not some time later


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkill_of_the_wrapper_kills_the_commands_children_too(marker: str) -> None:
    wrapper = start("run", "--key", "tree", "--", "sh", "-c", f"sleep {marker} | sleep {marker}")
    wait_for(lambda: len(holding(marker)) == 2, what="both sides of the pipeline to start")
    wrapper.kill()
    wrapper.wait(timeout=10)
    wait_for(lambda: not holding(marker), timeout=5, what="the pipeline to die with its wrapper")
    result = uniqjob("run", "--key", "tree", "--", "echo", "next")
    assert (result.returncode, result.stdout) == (0, "next\n"), result.stderr


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_children_that_outlive_sigterm_are_killed_after_the_grace(marker: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = '"$0" -c "$1" "$2" "$3"; exit $?'  # the shell dies of SIGTERM; its child ignores it
    proc = start(
        "run", "--kill-after", "0.3", "--grace", "0.3", "--",
        "sh", "-c", script, PY, STUBBORN, str(ready), marker,
    )  # fmt: skip
    wait_for(ready.exists, what="the shell's child to start")
    status, _, err = finish(proc)
    assert status == 143 and "sending SIGKILL" in err, err
    assert holding(marker) == []


def test_a_forwarded_signal_reaches_the_commands_children_once(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # The shell ignores SIGTERM, so only its child can act on it; the shell exits with the child's status.
    script = 'trap "" TERM; "$0" -c "$1" "$2" - "$3"; exit $?'
    proc = start("run", "--", "sh", "-c", script, PY, COUNT, str(ready), str(int(signal.SIGTERM)))
    wait_for(ready.exists, what="the shell's child to install its handler")
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 11, err


@pytest.mark.skipif(not LINUX, reason="waiting for the process group needs sigtimedwait")
def test_the_lock_is_held_until_the_commands_background_processes_end(tmp_path: Path) -> None:
    late = tmp_path / "late"
    script = f"(sleep 0.3; echo late > {shlex.quote(str(late))}) >/dev/null 2>&1 & echo early"
    result = uniqjob("run", "--", "sh", "-c", script)
    assert (result.returncode, result.stdout) == (0, "early\n"), result.stderr
    assert late.read_text() == "late\n"  # uniqjob returned only after the background job had ended
    assert uniqjob("release", command_key(["sh", "-c", script])).returncode == 1  # and released the lock


# -- at a terminal -----------------------------------------------------------------------

# Makes the pseudo-terminal on stdin the controlling terminal of this new session, then runs argv.
_SESSION = """\
import fcntl, os, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
os.execvp(sys.argv[1], sys.argv[1:])
"""


class Terminal:
    """A pseudo-terminal whose session leader runs ARGV; what it prints is read with ``expect``."""

    def __init__(self, *argv: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = os.openpty()
        try:
            self.proc = subprocess.Popen(
                [PY, "-c", _SESSION, *argv],
                stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env,
            )  # fmt: skip
        finally:
            os.close(slave)
        self.output = ""
        self.seen = 0

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the hangup that follows ends what runs at the terminal
        self.proc.wait(timeout=10)
        os.close(self.master)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, text: str, timeout: float = 10.0) -> None:
        """Read until ``text`` is printed (after what the last expect matched); fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (found := self.output.find(text, self.seen)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                pytest.fail(f"timed out waiting for {text!r}; the terminal shows:\n{self.output}")
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: nothing has the terminal open any more
                data = b""
            if not data:
                pytest.fail(f"the terminal closed before {text!r}; it shows:\n{self.output}")
            self.output += data.decode(errors="replace").replace("\r", "")
        self.seen = found + len(text)


# Reads a line from the terminal once it has printed "42-up" (not in its own source).
_READER = 'echo "$((6 * 7))-up"; read x; echo "got $x"'


@pytest.mark.skipif(not LINUX, reason="Linux pseudo-terminals")
def test_a_command_reads_the_terminal_and_ctrl_z_without_a_shell_does_not_stop_it() -> None:
    # The command's own process group gets the terminal, or a read would stop it (SIGTTIN).
    with Terminal(*UNIQJOB, "run", "--", "sh", "-c", _READER) as term:
        term.expect("42-up")
        term.type("\x1a")  # no shell here could resume a stopped job, so ^Z is ignored
        term.type("hello\n")
        term.expect("got hello")
        assert term.proc.wait(timeout=10) == 0


@pytest.mark.skipif(not LINUX or shutil.which("bash") is None, reason="needs bash and Linux pseudo-terminals")
def test_ctrl_z_and_fg_at_an_interactive_shell(tmp_path: Path) -> None:
    env = {
        **os.environ, "HOME": str(tmp_path), "HISTFILE": str(tmp_path / "history"),
        "INPUTRC": os.devnull, "PS1": "$ ", "TERM": "dumb",
    }  # fmt: skip
    with Terminal("bash", "--norc", "--noprofile", "-i", env=env) as term:
        term.type(shlex.join([*UNIQJOB, "run", "--", "sh", "-c", _READER]) + "\n")
        term.expect("42-up")
        term.type("\x1a")
        term.expect("Stopped")  # the shell saw its job stop, and has the terminal back
        term.type("fg\n")
        term.expect("fg\n")
        term.type("hello\n")
        term.expect("got hello")  # the command has the terminal again
        term.type("echo status=$?\n")
        term.expect("status=0")


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_command_starts_with_default_signal_dispositions() -> None:
    # Python ignores SIGPIPE and we block signals while waiting: neither may leak into the command.
    result = uniqjob("run", "--", "cat", "/proc/self/status")
    fields = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    assert int(fields["SigBlk"], 16) == 0
    assert not int(fields["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1))


def test_default_key_is_the_command_line() -> None:
    assert command_key(["echo", "a b"]) == command_key(["echo", "a b"])
    assert command_key(["echo", "a b"]) != command_key(["echo", "a", "b"])
    assert command_key(["echo"]).startswith("uniqjob.cli.run:1:")
