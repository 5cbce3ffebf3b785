"""The job layer's rules that do no I/O, shared by its two twins (``_job_async``, ``_job_sync``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NoReturn

from .errors import ConfigurationError
from .stores._log import get_logger

if TYPE_CHECKING:
    from .job import UniqueJob

__all__ = ["apause", "log", "pause", "refuse_sync", "settle_log"]

#: The job layer's logger, named in the README.
log = get_logger("uniqjob.job")
#: The queue integrations' (a delivery's settling).
settle_log = get_logger("uniqjob.integrations")

_sleep = time.sleep  # replaced by tests


def pause(seconds: float) -> None:
    """Wait ``seconds`` (an inline "reschedule" before it tries again)."""
    _sleep(seconds)  # looked up at each call: tests replace the module's _sleep


async def apause(seconds: float) -> None:
    """:func:`pause`, in the event loop."""
    import asyncio  # here: the sync path (cron's `uniqjob run`) never loads asyncio

    await asyncio.sleep(seconds)


def refuse_sync(cls: type[UniqueJob], entry: str) -> NoReturn:
    """Raise the error of an ``async def perform`` reached through the sync ``entry`` point."""
    raise ConfigurationError(
        f"{cls.__qualname__}.perform is an async function: call it through the asyncio API "
        f"(await {cls.__qualname__}.a{entry}(...)); {entry}() would not await it"
    )
