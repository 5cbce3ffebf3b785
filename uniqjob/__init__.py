"""uniqjob: stop duplicate background jobs.

Mix :class:`UniqueJob` into a job class; each call's lock key comes from the
class and its arguments. See the README for the guarantees.
"""

import typing as _typing

from .concurrency import Parked
from .config import backend_from_url, configure, default_backend
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
from .job import Queue, UniqueJob
from .joblock import JobLock, current_lock
from .stores.base import Backend

if _typing.TYPE_CHECKING:
    from . import ops as ops  # a submodule reached through __getattr__
    from .functions import unique
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

_LAZY = {
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
    # Backends load on first use: a script on the file store never imports redis.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'uniqjob' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


def __dir__() -> list[str]:
    """The public API (``__all__``) and the module's dunder names; not its submodules or helpers."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__") and name.endswith("__"))})
