"""A web dashboard of the locks in a store: ``uniqjob dashboard``, or :func:`create_app` to mount.

Needs the ``dashboard`` extra (``pip install 'uniqjob[dashboard]'``: Starlette,
Jinja2 and, to serve it on its own, uvicorn). The pages are rendered on the
server and read as they are with JavaScript off; a small script refreshes
them every few seconds and opens confirmations in place.

- ``/``: parked jobs, held locks (queued, running, orphaned);
- ``/locks``: the concurrency keys, busiest first, and the held locks, orphans first,
  each with its actions (Release, Discard parked) unless the dashboard is read-only.
"""

from __future__ import annotations

try:
    from ._app import create_app
except ModuleNotFoundError as exc:
    if (exc.name or "uniqjob").partition(".")[0] == "uniqjob":  # ours: a bug, not a missing extra
        raise
    raise ModuleNotFoundError(
        f"uniqjob.dashboard needs Starlette and Jinja2 ({exc.name} is missing):"
        " pip install 'uniqjob[dashboard]'",
        name=exc.name,
    ) from exc

__all__ = ["create_app"]
