"""The process-wide default backend and backends made from URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

import uniqjob
from tests.redis_server import RedisServer
from uniqjob import ConfigurationError
from uniqjob.config import backend_from_url, default_directory
from uniqjob.stores.file import FileBackend
from uniqjob.stores.memory import MemoryBackend
from uniqjob.stores.redis import RedisBackend


def test_default_is_a_file_store_in_the_state_directory(tmp_path: Path) -> None:
    backend = uniqjob.default_backend()
    assert isinstance(backend, FileBackend)
    assert backend.directory == tmp_path / "state" / "uniqjob" == default_directory()
    assert uniqjob.default_backend() is backend


def test_environment_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UNIQJOB_URL", f"file://{tmp_path}/env-locks")
    backend = uniqjob.default_backend()
    assert isinstance(backend, FileBackend) and backend.directory == tmp_path / "env-locks"


def test_configure_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIQJOB_URL", "memory://")
    mine = MemoryBackend()
    assert uniqjob.configure(mine) is mine
    assert uniqjob.default_backend() is mine


def test_urls(redis_server: RedisServer, tmp_path: Path) -> None:
    for url in (redis_server.url, redis_server.unix_url):
        backend = backend_from_url(url)
        assert isinstance(backend, RedisBackend)
        assert backend.read("k").free
        backend.close()
    assert isinstance(backend_from_url("memory://"), MemoryBackend)
    files = backend_from_url(f"file://{tmp_path}/a%20b")
    assert isinstance(files, FileBackend) and files.directory == tmp_path / "a b"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://localhost/db", "unsupported lock store URL 'postgres://localhost/db'"),
        ("localhost:6379", "unsupported lock store URL"),
        ("file://relative/dir", "bad file URL"),
        ("file://", "bad file URL"),
        ("redis://localhost:notaport/0", "bad Redis URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        uniqjob.configure(url)


def test_configure_rejects_other_objects() -> None:
    with pytest.raises(ConfigurationError, match="a redis-py client or a URL string, got int"):
        uniqjob.configure(42)  # type: ignore[arg-type]


def test_configure_takes_a_redis_py_client_with_its_defaults(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis(port=redis_server.port)  # redis-py's defaults (RESP3 on redis-py 8)
    store = uniqjob.configure(client)
    assert isinstance(store, RedisBackend)
    assert uniqjob.default_backend() is store
    lock = uniqjob.JobLock(store, "configure-client")
    assert lock.acquire()
    assert not uniqjob.JobLock(store, "configure-client").acquire()
    lock.release()
    client.close()


def test_configure_refuses_an_asyncio_client_by_name(redis_server: RedisServer) -> None:
    import redis.asyncio

    with pytest.raises(ConfigurationError, match="asyncio"):
        uniqjob.configure(redis.asyncio.Redis.from_url(redis_server.url))  # type: ignore[arg-type]
