"""The courier: a thread of its own that pushes the promotions the heartbeat finds.

The heartbeat thread renews the lease of every job running in the process, and
a renewal settles its key, which may promote parked calls. Pushing those to
their queue from the heartbeat thread would make every lease in the process
wait on one broker's publish (a client with no socket timeout could stop them
for good), so they are handed to this thread instead. It delivers them in the
order received, through the same :func:`~uniqjob.concurrency.semaphore.deliver`
as everyone else. A promotion this process never pushes (it died, or its push
hung past the handoff time) is claimed again by whoever settles the key next:
at least once, as any promotion.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence

from ..locks import Holder
from ..stores.semaphores import Promotion, SemaphoreStore

__all__ = ["Courier"]

Deliver = Callable[[SemaphoreStore, str, Sequence[Promotion], Holder], object]
_Item = tuple[SemaphoreStore, str, Promotion, Holder]

_IDLE = 60.0  # seconds with nothing to do before the thread ends (the next send starts another)


class Courier:
    """Delivers promotions handed to :meth:`send` on one daemon thread, oldest first.

    A promotion already waiting (same store, key and token: claimed again while
    an earlier push of it hangs) is not queued twice.
    """

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._after_fork()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # The parent's thread does not survive fork, and its queue holds the
        # parent's claims: a child pushing them would push copies it cannot hand in.
        self._mutex = threading.Lock()
        self._ready = threading.Condition(self._mutex)
        self._idle = threading.Condition(self._mutex)
        self._items: deque[_Item] = deque()
        self._waiting: set[tuple[int, str, str]] = set()
        self._busy = False
        self._thread: threading.Thread | None = None

    def send(self, store: SemaphoreStore, key: str, promotions: Sequence[Promotion], caller: Holder) -> None:
        """Queue ``promotions`` of ``key`` (claimed by ``caller``, this process) for delivery."""
        with self._mutex:
            for promotion in promotions:
                ident = (id(store), key, promotion.token)
                if ident in self._waiting:
                    continue
                self._waiting.add(ident)
                self._items.append((store, key, promotion, caller))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="uniqjob-courier", daemon=True)
                self._thread.start()
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._mutex:
                while not self._items:
                    if not self._ready.wait(_IDLE) and not self._items:
                        self._thread = None
                        return
                store, key, promotion, caller = self._items.popleft()
                self._busy = True
            try:
                self._deliver(store, key, [promotion], caller)  # logs its own failures
            finally:
                with self._mutex:
                    self._waiting.discard((id(store), key, promotion.token))
                    self._busy = False
                    if not self._items:
                        self._idle.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until everything sent so far is delivered; False if not."""
        with self._mutex:
            return self._idle.wait_for(lambda: not self._items and not self._busy, timeout)
