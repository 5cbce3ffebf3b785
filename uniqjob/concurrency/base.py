"""The semaphore store contract, now in :mod:`uniqjob.stores.semaphores`; importable here too."""

from __future__ import annotations

from ..stores.semaphores import (
    HANDOFF,
    TOMBSTONE,
    Outcome,
    Park,
    ParkedInfo,
    Promotion,
    SemaphoreState,
    SemaphoreStore,
    SlotInfo,
    decode_holder,
    encode_holder,
)

__all__ = [
    "HANDOFF",
    "TOMBSTONE",
    "Outcome",
    "Park",
    "ParkedInfo",
    "Promotion",
    "SemaphoreState",
    "SemaphoreStore",
    "SlotInfo",
    "decode_holder",
    "encode_holder",
]
