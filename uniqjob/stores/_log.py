"""uniqjob's loggers, which import :mod:`logging` when first used.

``uniqjob run`` on the file store logs nothing unless something goes wrong, and
:mod:`logging` (with traceback, linecache, tokenize, string) is a fair part of
its start-up. So a module's ``log = get_logger(__name__)`` is a stand-in that
becomes ``logging.getLogger(__name__)`` on its first use: the same logger, the
same records, its handlers and levels as configured.

Configuration that must be in place before a record of ours is handled (the
command's handler on stderr) goes through :func:`configured`: done at once when
:mod:`logging` is loaded, else when a logger of ours is first used. Every
logger in ``uniqjob`` is made here, so no record of ours comes before it.

It lives in the store layer, the lowest, which imports nothing above it: every
layer logs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging

__all__ = ["configured", "get_logger"]

_mutex = threading.RLock()  # a setup may use a logger of ours, or configure one
_pending: list[Callable[[], None]] = []  # setups waiting for logging to be used
_unsettled = [0]  # setups pending or running: another thread's record waits for them


class _Logger:
    """``logging.getLogger(name)``, fetched (and :mod:`logging` imported) on first use."""

    __slots__ = ("_logger", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    def __getattr__(self, attr: str) -> Any:
        logger = self._logger
        if logger is None:
            logger = self._logger = _logging().getLogger(self.name)
        return getattr(logger, attr)

    def __repr__(self) -> str:
        return repr(self._logger) if self._logger is not None else f"<logger {self.name} (not loaded yet)>"


def get_logger(name: str) -> logging.Logger:
    """Return the logger ``name``, as :func:`logging.getLogger`: :mod:`logging` loads when it is used."""
    return cast("logging.Logger", _Logger(name))


def _logging() -> Any:
    """Import :mod:`logging`, and run the setups waiting for it."""
    import logging

    if _unsettled[0]:
        with _mutex:
            while _pending:
                setup = _pending.pop(0)  # first: a setup that logs finds it done
                try:
                    setup()
                finally:
                    _unsettled[0] -= 1
    return logging


@contextmanager
def configured(setup: Callable[[], Callable[[], None]]) -> Iterator[None]:
    """Within the block, have ``setup()`` done (it returns its undo) before any record of ours.

    At once if :mod:`logging` is loaded; else when a logger of ours is first
    used, if one is; the undo runs when the block ends.
    """
    undo: list[Callable[[], None]] = []

    def run() -> None:
        undo.append(setup())

    with _mutex:
        if "logging" in sys.modules:
            _logging()  # the setups before it first, in order
            run()
        else:
            _pending.append(run)
            _unsettled[0] += 1
    try:
        yield
    finally:
        with _mutex:
            if run in _pending:
                _pending.remove(run)
                _unsettled[0] -= 1
            for done in undo:
                done()
