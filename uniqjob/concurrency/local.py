"""The file and memory semaphore stores, now beside their lock stores in :mod:`uniqjob.stores`."""

from __future__ import annotations

from ..stores._machine_store import MachineStore
from ..stores.file import FileSemaphores
from ..stores.memory import MemorySemaphores

__all__ = ["FileSemaphores", "MachineStore", "MemorySemaphores"]
