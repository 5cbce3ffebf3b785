"""Lock stores. Import a backend from its module; only the base is loaded here.

``RedisBackend`` (``uniqjob.backends.redis``) for many hosts, ``FileBackend``
(``uniqjob.backends.file``) for one host, ``MemoryBackend``
(``uniqjob.backends.memory``) for one process.
"""

from .base import Backend

__all__ = ["Backend"]
