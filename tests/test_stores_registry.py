"""The URL registry of ``uniqjob.stores``: a scheme registered once is usable wherever a URL is."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

import uniqjob
from uniqjob import ConfigurationError, UniqueJob, stores
from uniqjob.cli import main
from uniqjob.config import backend_from_url
from uniqjob.stores.memory import MemoryBackend

ROOT = Path(__file__).resolve().parent.parent
REDIS_FORMS = [
    "redis", "rediss", "unix",
    "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel",
    "valkey", "valkeys", "valkey+cluster", "valkeys+cluster", "valkey+sentinel", "valkeys+sentinel",
]  # fmt: skip
BUILT_IN = ", ".join(f"{scheme}://" for scheme in REDIS_FORMS) + ", file:/// or memory://"


class URLStore(MemoryBackend):
    """A store of this process that remembers the URL it was made from."""

    name = "test"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url


def made_by_path(url: str) -> URLStore:
    """A factory named by a "module:name" string (imported on first use)."""
    return URLStore(url)


@pytest.fixture
def made() -> Iterator[list[URLStore]]:
    """The scheme ``test`` registered for the test; each store its URLs make, in order."""
    found: list[URLStore] = []

    def factory(url: str) -> URLStore:
        store = URLStore(url)
        found.append(store)
        return store

    stores.register("test", factory)
    yield found
    stores.unregister("test")


def test_the_built_in_schemes() -> None:
    assert stores.schemes() == [*REDIS_FORMS, "file", "memory"]
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url("postgres://user:secret@db/locks")
    assert (
        str(caught.value) == f"unsupported lock store URL 'postgres://user:***@db/locks': expected {BUILT_IN}"
    )


def test_configure_resolves_a_registered_scheme(made: list[URLStore]) -> None:
    backend = uniqjob.configure("test://configured")
    assert made == [backend]
    assert isinstance(backend, URLStore) and backend.url == "test://configured"
    assert uniqjob.default_backend() is backend
    assert uniqjob.configure("test://configured") is backend  # one store per distinct URL
    assert uniqjob.configure("TEST://other") is made[1]  # a scheme matches in any case


def test_unique_backend_resolves_a_registered_scheme(made: list[URLStore]) -> None:
    class Export(UniqueJob):
        unique_backend = "test://jobs"
        held: ClassVar[list[bool]] = []

        def perform(self, n: int) -> int:
            [store] = made
            self.held.append(not store.read(Export.lock_key(n)).free)
            return n * 2

    assert Export.enqueue(21) == 42
    [store] = made
    assert Export.backend() is store and store.url == "test://jobs"
    assert Export.held == [True]  # the run's lock lived in the registered store
    assert store.read(Export.lock_key(21)).free


def test_the_cli_resolves_a_registered_scheme(
    made: list[URLStore], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["locks", "--url", "test://cli"]) == 0
    assert [store.url for store in made] == ["test://cli"]


def test_an_unknown_scheme_lists_the_registered_ones(made: list[URLStore]) -> None:
    with pytest.raises(ConfigurationError, match=r"expected redis://, .*, file:///, memory:// or test://$"):
        backend_from_url("nope://x")


def test_a_factory_named_by_path_is_imported_on_first_use() -> None:
    stores.register("bypath", f"{__name__}:made_by_path")
    try:
        store = backend_from_url("bypath://x")
        assert isinstance(store, URLStore) and store.url == "bypath://x"
    finally:
        stores.unregister("bypath")
    with pytest.raises(ConfigurationError, match="unsupported lock store URL 'bypath://x'"):
        backend_from_url("bypath://x")


def test_register_refuses_a_taken_scheme_unless_replacing(made: list[URLStore]) -> None:
    with pytest.raises(ConfigurationError, match="'test' is already registered"):
        stores.register("TEST", URLStore)
    stores.register("test", URLStore, replace=True)
    store = backend_from_url("test://replaced")
    assert isinstance(store, URLStore) and made == []


@pytest.mark.parametrize("scheme", ["", "1db", "a b", "a:b", "é"])
def test_register_refuses_a_malformed_scheme(scheme: str) -> None:
    with pytest.raises(ConfigurationError, match="a URL scheme is a letter"):
        stores.register(scheme, URLStore)


@pytest.mark.parametrize("factory", [42, "no.colon", "a:b:c"])
def test_register_refuses_what_is_no_factory(factory: object) -> None:
    with pytest.raises(ConfigurationError, match="a store factory is a callable or 'module:name'"):
        stores.register("odd", factory)  # type: ignore[arg-type]
    assert "odd" not in stores.schemes()


def test_a_factory_must_make_a_backend() -> None:
    stores.register("notastore", lambda url: object())  # type: ignore[arg-type, return-value]
    try:
        with pytest.raises(ConfigurationError, match="notastore:// URLs returned object, not a Backend"):
            backend_from_url("notastore://x")
    finally:
        stores.unregister("notastore")


def test_a_process_on_files_or_memory_never_imports_redis(tmp_path: Path) -> None:
    script = f"""
        import json, sys
        import uniqjob
        from uniqjob.stores.redis import REDIS_URL_OPTIONS

        class Job(uniqjob.UniqueJob):
            def perform(self, n):
                return n

        ran = []
        for url in ("file://{tmp_path}/locks", "memory://"):
            uniqjob.configure(url)
            ran.append(Job.enqueue(1))
        options = sorted(REDIS_URL_OPTIONS)[:1]  # the Redis options read without redis-py
        prefixes = ("redis.", "uniqjob.stores.redis.")
        loaded = sorted(m for m in sys.modules if m == "redis" or m.startswith(prefixes))
        print(json.dumps({{"ran": ran, "options": options, "loaded": loaded}}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {
        "ran": [1, 1],
        "options": ["client_name"],
        "loaded": ["uniqjob.stores.redis._url"],
    }
