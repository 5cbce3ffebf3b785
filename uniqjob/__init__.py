"""uniqjob: stop duplicate background jobs.

Mix :class:`UniqueJob` into a job class; each call's lock key comes from the
class and its arguments. See the README for the guarantees.
"""

import typing as _typing

from .errors import (
    BackendError,
    ConcurrencyLimitExceeded,
    ConfigurationError,
    CorruptRecordError,
    JobNotUnique,
    UniqJobError,
    UniqueKeyError,
    UnstorableCallError,
)

if _typing.TYPE_CHECKING:
    from . import ops as ops  # a submodule reached through __getattr__
    from ._coalesce import Pending
    from .concurrency import Parked
    from .config import backend_from_url, configure, default_backend
    from .functions import unique
    from .job import Queue, UniqueJob
    from .joblock import JobLock, current_lock
    from .stores.base import Backend
    from .stores.file import FileBackend
    from .stores.memory import MemoryBackend
    from .stores.redis import RedisBackend

__all__ = [
    "Backend",
    "BackendError",
    "ConcurrencyLimitExceeded",
    "ConfigurationError",
    "CorruptRecordError",
    "FileBackend",
    "JobLock",
    "JobNotUnique",
    "MemoryBackend",
    "Parked",
    "Pending",
    "Queue",
    "RedisBackend",
    "UniqJobError",
    "UniqueJob",
    "UniqueKeyError",
    "UnstorableCallError",
    "backend_from_url",
    "configure",
    "current_lock",
    "default_backend",
    "unique",
]

__version__ = "0.4.0"

# Every name but the errors loads on first use: ``import uniqjob`` costs no store, no
# asyncio, no redis and no concurrency machinery (a cron script on the file store pays
# only for what it calls; tests/test_imports.py holds it to that).
_LAZY = {
    "Backend": ".stores.base",
    "JobLock": ".joblock",
    "Parked": ".concurrency",
    "Pending": "._coalesce",
    "Queue": ".job",
    "UniqueJob": ".job",
    "backend_from_url": ".config",
    "configure": ".config",
    "current_lock": ".joblock",
    "default_backend": ".config",
    "FileBackend": ".stores.file",
    "MemoryBackend": ".stores.memory",
    "RedisBackend": ".stores.redis",
    "unique": ".functions",
}


# Submodules that ``import uniqjob`` alone reaches, on first use (not in __all__).
_SUBMODULES = ("ops",)


def __getattr__(name: str) -> object:
    from importlib import import_module

    if name in _SUBMODULES:
        return import_module("." + name, __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'uniqjob' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    """The public API (``__all__``) and the module's dunder names; not its submodules or helpers."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__") and name.endswith("__"))})
