"""Lock stores, and the registry that makes one from a URL.

Each store is one module: ``RedisBackend`` (``uniqjob.stores.redis``) for many
hosts, ``FileBackend`` (``uniqjob.stores.file``) for one host,
``MemoryBackend`` (``uniqjob.stores.memory``) for one process. Only the
contracts, and the record-machine templates a store written in Python
builds on, are loaded here.

:func:`from_url` picks the store of a URL by its scheme. :func:`uniqjob.configure`,
``UNIQJOB_URL``, a job class's ``unique_backend`` and the ``uniqjob`` command
all come here, so a store registered with :func:`register` is usable by URL
everywhere. A built-in store's module is imported when a URL first names it,
so a process whose locks are in files never imports redis.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from importlib import import_module

from ..errors import ConfigurationError
from ._machine import Machine
from ._records import LockMachine
from ._template import LockMachineBackend, MachineStore
from ._urls import REDIS_SCHEMES, scheme_of, shown  # the Redis schemes' names: not its store, nor redis-py
from .base import Backend
from .semaphores import SemaphoreStore

# The contracts, and the record-machine templates a new store in Python builds on
# (README "Writing a store"): a store implements their one hook.
__all__ = [
    "Backend",
    "LockMachine",
    "LockMachineBackend",
    "Machine",
    "MachineStore",
    "SemaphoreStore",
    "StoreFactory",
    "from_url",
    "register",
    "schemes",
    "unregister",
]


#: Makes a store from a URL of its scheme; a malformed URL is a ConfigurationError naming the problem.
StoreFactory = Callable[[str], Backend]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")

_mutex = threading.Lock()
_factories: dict[str, StoreFactory | str] = {}  # a "module:name" string is imported on first use
_forms: dict[str, str] = {}  # how a message lists each scheme


def register(
    scheme: str, factory: StoreFactory | str, *, form: str | None = None, replace: bool = False
) -> None:
    """Make :func:`from_url` build the stores of ``scheme://`` URLs with ``factory(url)``.

    ``factory`` is a callable, or ``"package.module:name"`` naming one, imported
    when a URL of the scheme is first used. ``form`` is how the message for an
    unknown scheme lists this one (default ``scheme://``). Schemes are matched
    case-insensitively; registering a scheme already taken is refused unless
    ``replace`` is true.
    """
    key = scheme.lower() if isinstance(scheme, str) else scheme
    if not isinstance(key, str) or not _SCHEME.fullmatch(key):
        raise ConfigurationError(
            f"a URL scheme is a letter, then letters, digits, '+', '-' or '.': got {scheme!r}"
        )
    if not (callable(factory) or (isinstance(factory, str) and factory.count(":") == 1)):
        raise ConfigurationError(f"a store factory is a callable or 'module:name', got {factory!r}")
    with _mutex:
        if key in _factories and not replace:
            raise ConfigurationError(f"the URL scheme {key!r} is already registered (pass replace=True)")
        _factories[key] = factory
        _forms[key] = form or f"{key}://"


def unregister(scheme: str) -> None:
    """Forget ``scheme``: its URLs are then unsupported. An unknown scheme is ignored."""
    with _mutex:
        _factories.pop(scheme.lower(), None)
        _forms.pop(scheme.lower(), None)


def schemes() -> list[str]:
    """The registered URL schemes, in the order they were registered."""
    with _mutex:
        return list(_factories)


def from_url(url: str) -> Backend:
    """Return a new store for ``url``, made by the factory registered for its scheme.

    An unregistered scheme, or a URL its store refuses, is a
    :class:`ConfigurationError` naming the problem (any password masked).
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"expected a lock store URL string, got {type(url).__name__}")
    scheme = scheme_of(url)
    factory = _factories.get(scheme)
    if factory is None:
        raise ConfigurationError(f"unsupported lock store URL {shown(url)}: expected {_expected()}")
    if isinstance(factory, str):
        factory = _load(scheme, factory)
    store = factory(url)
    if not isinstance(store, Backend):
        raise ConfigurationError(
            f"the store factory of {scheme}:// URLs returned {type(store).__name__}, not a Backend"
        )
    return store


def _load(scheme: str, path: str) -> StoreFactory:
    """Import the factory ``path`` names, and keep it for the next URL of ``scheme``."""
    module, _, name = path.partition(":")
    factory: StoreFactory = getattr(import_module(module), name)
    with _mutex:
        if _factories.get(scheme) == path:
            _factories[scheme] = factory
    return factory


def _expected() -> str:
    with _mutex:
        forms = list(_forms.values())
    if len(forms) < 2:
        return "".join(forms) or "no scheme is registered"
    return f"{', '.join(forms[:-1])} or {forms[-1]}"


for _scheme in REDIS_SCHEMES:  # one server, a cluster, a Sentinel service; Redis or Valkey
    register(_scheme, "uniqjob.stores.redis:from_url")
register("file", "uniqjob.stores.file:from_url", form="file:///")
register("memory", "uniqjob.stores.memory:from_url")
