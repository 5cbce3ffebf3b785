"""The dashboard's ASGI application: pages rendered on the server, actions as token-checked POSTs.

Pages read the store in a worker thread (the store's calls block). Every
action acts on one key, is a POST carrying a token only this application's
pages hand out (an HMAC of the action and key under a secret made when the
application is created), and is absent from a read-only dashboard, which
refuses those requests with 403.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import secrets
import time
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from .. import config
from ..errors import BackendError
from ..ops import LockRelease, Released, concurrency, concurrency_key, discard_parked, drops, release
from ..stores.base import Backend
from . import _data
from ._format import duration

__all__ = ["create_app"]

_MAX_FORM = 64 * 1024  # a form carries a key and a token; anything bigger is not ours
_KINDS = ("lock", "concurrency")
#: Every page: no script but ours, no framing (a confirmation cannot be clicked through another site).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format


class _Refused(Exception):
    """A request this dashboard will not serve: its status and the sentence said on the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("uniqjob.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = duration
    env.filters["blocked"] = _data.blocked
    return env


class _Dashboard:
    """The pages and actions of one application: its store, its mode and its token secret."""

    def __init__(self, backend: Backend | None, read_only: bool) -> None:
        self.backend = backend
        self.read_only = read_only
        self.secret = secrets.token_bytes(32)
        self.env = _environment()
        self.script = resources.files("uniqjob.dashboard").joinpath("static/dashboard.js").read_bytes()
        routes = [
            Route("/", self.home, name="home"),
            Route("/locks", self.locks, name="locks"),
            Route("/confirm/release", self.confirm_release, name="confirm_release"),
            Route("/confirm/discard-parked", self.confirm_discard, name="confirm_discard"),
            Route("/release", self.release, methods=["POST"], name="release"),
            Route("/discard-parked", self.discard, methods=["POST"], name="discard_parked"),
            Route("/metrics", self.metrics, name="metrics"),
            Route("/static/dashboard.js", self.dashboard_js, name="script"),
        ]
        self.app = Starlette(
            routes=routes, exception_handlers={_Refused: self.refused, BackendError: self.unavailable}
        )

    def store(self) -> Backend:
        return self.backend if self.backend is not None else config.default_backend()

    def token(self, action: str, kind: str, key: str) -> str:
        """The CSRF token of one action on one key: only pages of this application know it."""
        message = "\0".join((action, kind, key)).encode("utf-8", "surrogatepass")
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        def link(route: str, **query: str) -> str:
            # Under the prefix this app is mounted at, whatever the host application's routes are named.
            path = request.scope.get("root_path", "").rstrip("/") + self.app.router.url_path_for(route)
            return str(URL(path).include_query_params(**query) if query else URL(path))

        page = self.env.get_template(name).render(
            request=request, link=link, read_only=self.read_only, token=self.token, **context
        )
        return HTMLResponse(page, status_code=status, headers=_HEADERS)

    # -- pages (sync: Starlette runs them in a worker thread, as the store's calls block) --

    def home(self, request: Request) -> Response:
        backend = self.store()
        began = time.monotonic()
        return self.render(
            request,
            "home.html",
            concurrency=concurrency(backend, top=0).totals,
            locks=_data.uniqueness(backend, limit=0),
            drops=(kinds := drops(backend, window=_data.DROPS_WINDOW))["duplicates"],
            kinds=kinds,
            drops_shown=_data.DROPS_SHOWN,
            took=time.monotonic() - began,
        )

    def locks(self, request: Request) -> Response:
        backend = self.store()
        job_class = request.query_params.get("class") or None
        began = time.monotonic()
        report = concurrency(backend, top=_data.TOP)
        locks = _data.uniqueness(backend, job_class=job_class, limit=_data.ROWS)
        return self.render(
            request,
            "locks.html",
            report=report,
            top=_data.TOP,
            locks=locks,
            job_class=job_class or "",
            took=time.monotonic() - began,
        )

    def _writable(self) -> None:
        if self.read_only:
            raise _Refused(403, "This dashboard is read-only: it changes nothing.")

    def confirm_release(self, request: Request) -> Response:
        self._writable()
        kind, key = _target(dict(request.query_params))
        if kind == "lock":
            found = _data.lock_row(self.store(), key)
            return self.render(request, "confirm.html", action="release", kind=kind, key=key, lock=found)
        report = concurrency_key(key, self.store())
        return self.render(request, "confirm.html", action="release", kind=kind, key=key, slots=report)

    def confirm_discard(self, request: Request) -> Response:
        self._writable()
        kind, key = _target(dict(request.query_params), kind="concurrency")
        report = concurrency_key(key, self.store())
        return self.render(request, "confirm.html", action="discard-parked", kind=kind, key=key, slots=report)

    # -- actions ---------------------------------------------------------------------------

    async def _form(self, request: Request, action: str) -> dict[str, str]:
        """The POSTed form, once its token is checked (403 without a good one)."""
        self._writable()
        body = await request.body()
        if len(body) > _MAX_FORM:
            raise _Refused(413, "The form is too large.")
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        params = {name: values[0] for name, values in fields.items()}
        kind, key = _target(params, kind="concurrency" if action == "discard-parked" else None)
        given = params.get("csrf", "")
        if not given or not hmac.compare_digest(given, self.token(action, kind, key)):
            raise _Refused(403, "Missing or bad CSRF token: reload the page and confirm again.")
        params["kind"] = kind
        return params

    async def release(self, request: Request) -> Response:
        params = await self._form(request, "release")
        force = params.get("force") == "1"
        done = await run_in_threadpool(release, params["key"], self.store(), force=force)
        status = 200 if _released(done) else 409
        return self.render(request, "done.html", status=status, key=params["key"], done=done)

    async def discard(self, request: Request) -> Response:
        params = await self._form(request, "discard-parked")
        count = await run_in_threadpool(discard_parked, params["key"], self.store())
        return self.render(
            request, "done.html", status=200 if count else 409, key=params["key"], discarded=count
        )

    def metrics(self, request: Request) -> Response:
        """The store's figures in Prometheus' text format (:func:`uniqjob.metrics.render`)."""
        try:
            metrics = importlib.import_module("uniqjob.metrics")
        except ImportError as exc:
            raise _Refused(501, str(exc)) from None
        return Response(metrics.render(self.store()), media_type=_PROMETHEUS)

    def dashboard_js(self, request: Request) -> Response:
        return Response(self.script, media_type="text/javascript")

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return self.render(request, "error.html", status=exc.status, message=exc.message)

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", status=503, message=f"Lock store unavailable: {exc}")


def create_app(backend: Backend | str | None = None, *, read_only: bool = False) -> Starlette:
    """Return the dashboard as an ASGI application, to serve or to mount inside another one.

    ``backend`` is a store or its URL; None reads the configured one
    (:func:`uniqjob.configure`, else ``UNIQJOB_URL``) at each request.
    ``read_only`` leaves out every action and refuses their requests.
    """
    store = config.resolve(backend) if backend is not None else None
    return _Dashboard(store, read_only).app


def _target(params: dict[str, str], *, kind: str | None = None) -> tuple[str, str]:
    """The kind and key an action names (400 if either is missing or unknown)."""
    key = params.get("key", "")
    kind = kind or params.get("kind", "")
    if not key:
        raise _Refused(400, "No key given.")
    if kind not in _KINDS:
        raise _Refused(400, f"Unknown kind {kind!r}: expected lock or concurrency.")
    return kind, key


def _released(done: LockRelease | Released | None) -> bool:
    if done is None:
        return False
    if isinstance(done, LockRelease):
        return done.ok
    return bool(done.released or done.promoted)
