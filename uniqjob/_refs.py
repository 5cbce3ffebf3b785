"""A job class by its importable name, ``module:QualName``: how a worker (or ``uniqjob reap``) finds it."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .job import UniqueJob

__all__ = ["job_ref", "resolve_job"]


def job_ref(job_cls: type[UniqueJob]) -> str:
    """Return ``module:QualName`` of a job class, after checking that a worker can import it."""
    qualname = job_cls.__qualname__
    if "<locals>" in qualname or job_cls.__module__ == "__main__":
        raise ConfigurationError(
            f"{job_cls.job_name()} cannot be imported by a worker: define job classes at the top"
            " level of an importable module (not in a function, not in __main__)"
        )
    return f"{job_cls.__module__}:{qualname}"


def resolve_job(ref: str) -> type[UniqueJob]:
    """Import the job class named by :func:`job_ref`; ConfigurationError if it cannot be found."""
    from .job import UniqueJob  # (imported by the job layer's modules: not at import time)

    module_name, _, qualname = ref.partition(":")
    if not module_name or not qualname:
        raise ConfigurationError(f"bad job class reference {ref!r}: expected 'module:QualName'")
    try:
        found: Any = import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
        found = getattr(found, "unique_job", found)  # a @unique function: its job class
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import job class {ref!r}: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, UniqueJob)):
        raise ConfigurationError(f"{ref!r} is not a UniqueJob class")
    return found
