"""Undo what a step whose reply was lost may have left in the store.

A claim, start or release that fails with :class:`BackendError` may still
have been applied: the store took the request and only its reply was lost
(a timeout mid-reply, a stall). The caller then believes it holds nothing,
and a lock left behind would refuse the key to everyone. So the step's
token-checked undo is registered here, tried at once, and retried until the
store answers: on a thread of its own, about twice a second, and by the next
lock call in this process. Tokens are never reused, so an undo can be
repeated safely; one that found nothing is repeated for a while longer
(``SETTLE``), because the lost request may still be on its way to the store
(it was sent on another connection than the undo, and TCP may deliver it
late). A process that exits with undos pending tries each once more on its
way out (``atexit``).

What this cannot cover: a process killed (SIGKILL, a crash) before the store
answered again. Its claim, if applied, stays: a queued lock until its queue
proves the job gone or ``unique_lock_autoexpire`` passes, and ``uniqjob
locks`` shows it; a running one lapses with its lease.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable

from .stores._log import get_logger

__all__ = ["Undos", "undos"]

log = get_logger(__name__)

#: Seconds between two rounds of tries; doubled after a round the store did not answer, up to MAX_RETRY.
RETRY = 0.5
MAX_RETRY = 30.0
#: Seconds for which an undo that found nothing goes on being tried.
SETTLE = 15.0


class _Undo:
    """One pending undo: ``act()`` returns True if it removed something.

    A plain class, not a dataclass: making a dataclass costs each process that imports this one.
    """

    def __init__(self, act: Callable[[], bool], what: str, tokens: frozenset[str], key: str) -> None:
        self.act = act
        self.what = what
        self.tokens = tokens
        self.key = key
        self.found_nothing_at: float | None = None  # monotonic time of a try that found nothing


class Undos:
    """The pending undos of this process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._at_exit = False
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also after fork, in the child: the parent keeps retrying its own undos; a child starts with none.
        #: The undos not yet done (read it to ask "any?": it costs no call).
        self.pending: list[_Undo] = []
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, act: Callable[[], bool], what: str, tokens: tuple[str, ...], key: str = "") -> None:
        """Register ``act``, the token-checked undo of ``what``, tried from now on until it is done.

        The tries run on a thread: the caller has just waited for a store that
        did not answer, and should not wait for it again. With ``key``, this process's
        next claim of that key tries it first (see :meth:`settle`).
        """
        undo = _Undo(act, what, frozenset(tokens), key)
        with self._mutex:
            self.pending.append(undo)
            if not self._at_exit:
                self._at_exit = True
                atexit.register(self.flush)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="uniqjob-undo", daemon=True)
                self._thread.start()

    def owns(self, token: str) -> bool:
        """True if ``token`` belongs to a step this process is undoing (its lock is a leftover)."""
        return any(token in undo.tokens for undo in self.pending)

    def flush(self) -> bool:
        """Try every pending undo once, until one fails (the store is still away); keep the rest.

        Returns False if the store failed.
        """
        with self._mutex:
            pending = list(self.pending)
        for undo in pending:
            done = self._try(undo)
            if done is None:
                return False
            if done:
                self._discard(undo)
        return True

    def settle(self, keys: list[str]) -> None:
        """Try once, now, the pending undos registered for one of ``keys`` (a claim of them is next).

        A release retried in the background may hand on, or drop, the call that waited behind
        its run: the claim must find the key as that leaves it, not coalesce into a call the
        undo is about to drop. A store still away fails the claim that follows all the same.
        """
        with self._mutex:
            mine = [undo for undo in self.pending if undo.key in keys]
        for undo in mine:
            if self._try(undo):
                self._discard(undo)

    async def asettle(self, keys: list[str]) -> None:
        """:meth:`settle` from an event loop, in a worker thread: each try may wait for the store."""
        from .stores._async_base import in_thread  # here: the sync path never loads asyncio

        await in_thread(self.settle, keys)

    def _discard(self, undo: _Undo) -> None:
        """Forget ``undo``, done (by this thread, or meanwhile by another)."""
        with self._mutex:
            if undo in self.pending:
                self.pending.remove(undo)

    def clear(self) -> None:
        """Forget every pending undo (tests: each starts with a store of its own)."""
        with self._mutex:
            self.pending.clear()

    def _try(self, undo: _Undo) -> bool | None:
        """Run ``undo`` once; True when it is done, None if the store failed."""
        try:
            removed = undo.act()
        except Exception as exc:  # the store is still away: retried on the next round
            log.debug("undo of %s failed again (%s)", undo.what, exc)
            return None
        if removed:
            log.warning("removed %s, left by a step whose reply was lost", undo.what)
            return True
        now = self.clock()
        if undo.found_nothing_at is None:
            undo.found_nothing_at = now
            return False
        return now - undo.found_nothing_at >= SETTLE

    def _loop(self) -> None:
        delay = RETRY
        while True:
            delay = RETRY if self.flush() else min(2 * delay, MAX_RETRY)
            self._wake.wait(delay)
            with self._mutex:
                if not self.pending:
                    self._thread = None
                    return


#: The process-wide pending undos, used by :class:`uniqjob.JobLock`.
undos = Undos()
