"""Self-test of the private redis-server helper."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration_workers import alive
from tests.redis_server import RedisServer


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def test_answers_ping_over_tcp_and_unix_socket(server: RedisServer) -> None:
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert server.unix_url == f"unix://{server.socket_path}?db=0"
    assert _client(server.url).ping()
    assert _client(server.unix_url).ping()
    _client(server.url).set("k", "v")
    assert _client(server.unix_url).get("k") == b"v"


def test_restart_keeps_address_and_loses_data(server: RedisServer) -> None:
    port, path, pid = server.port, server.socket_path, server.pid
    _client(server.url).set("k", "v")
    server.restart()
    assert (server.port, server.socket_path) == (port, path)
    assert server.pid != pid
    assert _client(server.url).get("k") is None
    assert _client(server.unix_url).ping()


def test_stop_makes_connections_fail_and_start_recovers(server: RedisServer) -> None:
    pid = server.pid
    assert pid is not None
    server.stop()
    assert server.pid is None
    assert not alive(pid)
    for url in (server.url, server.unix_url):
        with pytest.raises(redis.ConnectionError):
            _client(url).ping()
    server.start()
    assert _client(server.url).ping()


def test_close_removes_the_directory() -> None:
    srv = RedisServer()
    srv.start()
    directory = Path(srv.socket_path).parent
    srv.close()
    assert not directory.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PDEATHSIG is Linux")
def test_server_dies_with_its_parent() -> None:
    code = (
        "import time; from tests.redis_server import RedisServer\n"
        "s = RedisServer(); s.start()\n"
        "print(s.pid, s.socket_path, flush=True); time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        pid_text, socket_path = child.stdout.readline().split()
        redis_pid = int(pid_text)
        assert alive(redis_pid)
        child.kill()
    try:
        deadline = time.monotonic() + 5
        while alive(redis_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(redis_pid)
    finally:
        if alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
        shutil.rmtree(Path(socket_path).parent, ignore_errors=True)
