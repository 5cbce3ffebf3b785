"""Lock stores. Import a store from its module; only the contract is loaded here.

``RedisBackend`` (``uniqjob.stores.redis``) for many hosts, ``FileBackend``
(``uniqjob.stores.file``) for one host, ``MemoryBackend``
(``uniqjob.stores.memory``) for one process.
"""

from .base import Backend

__all__ = ["Backend"]
