"""One name per concept: the names kept for compatibility before 1.0 are gone, and no module of
uniqjob is named after a standard library module (so none shadows it, and nothing rewrites
``sys.path``; tests/test_packaging.py runs ``python -m uniqjob`` inside the package directory).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import uniqjob
import uniqjob.concurrency
import uniqjob.config
import uniqjob.stores
import uniqjob.stores.base
from uniqjob.joblock import JobLock
from uniqjob.locks import Holder, LockState, QueueMeta, RunClaim
from uniqjob.stores.memory import MemoryBackend

PACKAGE = Path(uniqjob.__file__).resolve().parent
ME = Holder("host-a", "node-a", os.getpid(), 1)
META = QueueMeta("tests.Job", "(1,)")

#: Modules that once were, or still would be, a second home of something, or a stdlib module's name.
OLD_MODULES = [
    "uniqjob.backends",
    "uniqjob.backends.base",
    "uniqjob.backends.file",
    "uniqjob.backends.memory",
    "uniqjob.backends.redis",
    "uniqjob.inspect",  # now uniqjob.ops
    "uniqjob.queue",  # now uniqjob.queues
    "uniqjob.concurrency.base",  # now uniqjob.stores.semaphores
    "uniqjob.concurrency.local",  # now uniqjob.stores.file and uniqjob.stores.memory
    "uniqjob.concurrency.redis",  # now uniqjob.stores.redis
    "uniqjob._moved",
    "uniqjob._syspath",
]

CONFIG_MOVED = [
    "FILE_URL_OPTIONS",
    "MEMORY_URL_OPTIONS",
    "REDIS_TIMEOUT",
    "REDIS_URL_OPTIONS",
    "redis_client_from_url",
]


@pytest.mark.parametrize("name", OLD_MODULES)
def test_an_old_module_is_gone(name: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (uniqjob, "inspect"),
        (uniqjob, "Store"),
        (uniqjob.stores, "Store"),
        (uniqjob.stores.base, "Store"),
        (uniqjob.stores, "Slot"),
        (uniqjob.stores, "SlotBackend"),
        (LockState, "quiet"),
        (JobLock, "slots"),
        (uniqjob.concurrency, "release"),  # release_slots, as in uniqjob.ops
        *((uniqjob.config, name) for name in CONFIG_MOVED),  # each in its store's module
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_an_old_name_is_gone(owner: object, name: str) -> None:
    assert not hasattr(owner, name)


def test_lock_state_unread_takes_only_its_one_keyword() -> None:
    with pytest.raises(TypeError):
        LockState.unread("k", lambda: (None, None, 1.0), quiet=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        LockState.unread("k", lambda: (None, None, 1.0))  # type: ignore[call-arg]
    assert LockState.unread("k", lambda: (None, None, 1.0), nothing_to_reclaim=True).nothing_to_reclaim


def test_start_takes_only_queue_lock() -> None:
    backend = MemoryBackend()
    assert backend.claim("k", "t", meta=META) is None
    start: Any = backend.start
    with pytest.raises(TypeError):
        start("k", "t", run=RunClaim(ME, 5.0), meta=META, queue="release")
    assert backend.read("k").run is None


def test_no_module_is_named_after_a_standard_library_module() -> None:
    clash = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*")
        if "__pycache__" not in path.parts
        and (path.stem if path.suffix == ".py" else path.name if path.is_dir() else "")
        in sys.stdlib_module_names
    )
    assert clash == []


def test_the_package_leaves_sys_path_alone() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; before = list(sys.path); import uniqjob; print(sys.path == before)",
        ],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "True"
