"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright, on a real Redis.

The store holds real parked jobs, a stale slot and an orphaned lock (a worker
that died mid-job), made with the library's own API (tests/dashboard_jobs.py).
The run takes screenshots of the home and Locks pages; with
``UNIQJOB_SCREENSHOTS=docs`` it writes them over docs/dashboard-home.png and
docs/dashboard-locks.png (the README's pictures), else into the test's own
directory, so an ordinary run leaves the checkout as it found it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

import uvicorn
from playwright import sync_api

import uniqjob
from tests import dashboard_jobs
from tests.dashboard_jobs import QUEUE, SCRIPT, Scene
from tests.integration_workers import wait_until
from tests.redis_server import RedisServer
from uniqjob import ops
from uniqjob.dashboard import create_app
from uniqjob.stores.base import Backend

CHROMIUM = os.environ.get("UNIQJOB_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    ),
]
expect = sync_api.expect
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: docs/ if asked (``UNIQJOB_SCREENSHOTS=docs``), else the test's directory."""
    return DOCS if os.environ.get("UNIQJOB_SCREENSHOTS") == "docs" else tmp_path


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def store(redis_server: RedisServer, redis_client: object) -> Backend:
    """The session's Redis, emptied, under the namespace a ``--url`` opens."""
    return uniqjob.config.resolve(redis_server.url)


@pytest.fixture
def scene(store: Backend) -> Iterator[Scene]:
    yield dashboard_jobs.build(store)
    QUEUE.pushed.clear()


class Served:
    """The dashboard served by uvicorn from a thread of this process, on a free port."""

    def __init__(self, backend: Backend, *, read_only: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        config = uvicorn.Config(create_app(backend, read_only=read_only), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_until(lambda: self.server.started, "the dashboard to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture
def served(store: Backend) -> Iterator[Served]:
    with Served(store) as server:
        yield server


@pytest.fixture
def page(browser: sync_api.Browser) -> Iterator[sync_api.Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()


def key_row(page: sync_api.Page, key: str) -> sync_api.Locator:
    return page.locator(f'tr[data-key="{key}"]')


def confirm(page: sync_api.Page, key: str, action: str = "Release") -> sync_api.Locator:
    """Click ``action`` in ``key``'s row of the Locks page; return the confirmation dialog."""
    key_row(page, key).get_by_role("link", name=action).click()
    return page.locator("dialog#confirm-dialog")


def figure(page: sync_api.Page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


def test_cards_and_rows_show_the_stores_figures(
    page: sync_api.Page, served: Served, scene: Scene, shots: Path
) -> None:
    page.goto(served.url)
    assert figure(page, '#card-parked [data-figure="parked"]') == "3"
    assert re.fullmatch(r"[\d.]+ s", figure(page, '#card-parked [data-figure="oldest-wait"]'))
    assert figure(page, '#card-locks [data-figure="held"]') == "8"
    assert [
        figure(page, f'#card-locks [data-figure="{name}"]') for name in ("queued", "running", "orphaned")
    ] == [
        "6",
        "2",
        "1",
    ]
    page.screenshot(
        path=str(shots / "dashboard-home.png"), clip={"x": 0, "y": 0, "width": 1000, "height": 280}
    )
    assert is_png(shots / "dashboard-home.png")
    page.click("#card-parked")
    page.wait_for_url(re.compile(r"/locks#concurrency$"))

    assert figure(page, "#total-parked .figure") == "3"
    assert (
        figure(page, "#total-slots .figure") == "3"
        and figure(page, "#total-slots [data-figure=stale]") == "1"
    )
    assert figure(page, "#total-at-limit .figure") == "3"
    backlog = key_row(page, scene.backlog)
    assert (
        backlog.locator(".held").inner_text() == "1 / 1" and backlog.locator(".lease").inner_text() == "fresh"
    )
    assert backlog.locator(".parked").inner_text() == "2"
    blocked = key_row(page, scene.blocked)
    assert blocked.get_attribute("class") == "flagged"
    assert "stale slot blocks 1 parked" in blocked.locator(".flag").inner_text()
    assert key_row(page, scene.backlog).get_attribute("class") is None
    assert "keys beyond the 100 busiest are not shown" in page.locator("#top-note").inner_text()

    rows = page.locator("#lock-rows tbody tr")
    assert rows.count() == scene.held
    assert rows.first.get_attribute("data-key") == scene.orphan  # orphans first
    orphan = key_row(page, scene.orphan)
    assert orphan.locator(".orphaned").inner_text() == "yes"
    assert orphan.locator(".job-id").inner_text() == "job-2"
    assert orphan.locator(".args").inner_text() == "2, 'crashed'"
    assert re.fullmatch(r".+:\d+", orphan.locator(".holder").inner_text())
    page.screenshot(path=str(shots / "dashboard-locks.png"), full_page=True)
    assert is_png(shots / "dashboard-locks.png")


def test_a_script_in_an_argument_is_shown_as_text(page: sync_api.Page, served: Served, scene: Scene) -> None:
    page.goto(served.url + "locks")
    (row,) = [r for r in page.locator("#lock-rows tbody tr").all() if SCRIPT in r.inner_text()]
    assert row.locator(".args").inner_text() == f"3, '{SCRIPT}'"
    assert page.evaluate("window.pwned") is None
    assert page.locator("#lock-rows script").count() == 0


def test_release_with_a_fresh_lease_warns_then_promotes_the_oldest_parked(
    page: sync_api.Page, served: Served, scene: Scene
) -> None:
    page.goto(served.url + "locks")
    dialog = confirm(page, scene.backlog)
    expect(dialog).to_contain_text("a job is probably still running; releasing lets another start beside it")
    QUEUE.pushed.clear()
    dialog.get_by_role("button", name=re.compile("anyway")).click()
    expect(page.locator("#outcome")).to_contain_text("promoted 1 parked job(s)")
    assert [entry[3] for entry in QUEUE.pushed] == [(1, "second")]  # the oldest parked, pushed to its queue
    page.get_by_role("link", name="Back to Locks").click()
    assert key_row(page, scene.backlog).locator(".parked").inner_text() == "1"


def test_a_stale_lease_asks_less_and_frees_only_it(
    page: sync_api.Page, served: Served, scene: Scene, store: Backend
) -> None:
    page.goto(served.url + "locks")
    dialog = confirm(page, scene.blocked)
    expect(dialog).to_contain_text("Frees the 1 stale slot(s)")
    assert "probably still running" not in dialog.inner_text()
    dialog.get_by_role("button", name="Cancel").or_(dialog.get_by_role("link", name="Cancel")).click()
    expect(dialog).to_be_hidden()
    confirm(page, scene.blocked).get_by_role("button", name="Release").click()
    expect(page.locator("#outcome")).to_contain_text("Released 1 slot(s)")
    after = ops.concurrency_key(scene.blocked, store)
    assert after is not None and (after.stale, after.parked) == (0, 0)


def test_discard_parked_says_how_many_and_empties_the_key(
    page: sync_api.Page, served: Served, scene: Scene, store: Backend
) -> None:
    page.goto(served.url + "locks")
    dialog = confirm(page, scene.backlog, "Discard parked")
    expect(dialog).to_contain_text("2 parked job(s) will never run")
    dialog.get_by_role("button", name=re.compile("Discard")).click()
    expect(page.locator("#outcome")).to_contain_text("Discarded 2 parked job(s)")
    page.goto(served.url + "locks")
    assert key_row(page, scene.backlog).locator(".parked").inner_text() == "0"
    assert key_row(page, scene.backlog).get_by_role("link", name="Discard parked").count() == 0
    after = ops.concurrency_key(scene.backlog, store)
    assert after is not None and after.parked == 0


def test_without_javascript_a_confirmation_is_a_page(
    browser: sync_api.Browser, served: Served, scene: Scene, store: Backend
) -> None:
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(served.url + "locks")
        key_row(page, scene.orphan).get_by_role("link", name="Release").click()
        page.wait_for_url(re.compile(r"/confirm/release\?"))
        assert "orphaned" in page.locator("#confirm-text").inner_text()
        page.get_by_role("button", name="Release").click()
        expect(page.locator("#outcome")).to_contain_text("Released the locks of")
        assert store.read(scene.orphan).free
    finally:
        context.close()


def test_the_refresh_keeps_the_scroll_and_an_open_confirmation(
    page: sync_api.Page, served: Served, scene: Scene, store: Backend
) -> None:
    page.goto(served.url + "locks")
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0
    dashboard_jobs.Report.enqueue("2026-12-02")
    expect(page.locator("#uniqueness-body .cards .figure").first).to_have_text("9", timeout=15_000)
    assert page.evaluate("window.scrollY") == scrolled
    dialog = confirm(page, scene.live)
    expect(dialog).to_be_visible()
    dashboard_jobs.Report.enqueue("2026-12-03")
    time.sleep(7)  # more than one refresh period: the browser's own clock, not the store's
    expect(dialog).to_be_visible()
    assert page.locator("#uniqueness-body .cards .figure").first.inner_text() == "9"
    dialog.get_by_role("link", name="Cancel").click()
    expect(page.locator("#uniqueness-body .cards .figure").first).to_have_text("10", timeout=15_000)


def test_read_only_command_offers_no_action_and_refuses_posts(
    page: sync_api.Page, redis_server: RedisServer, scene: Scene, store: Backend
) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uniqjob",
            "dashboard",
            "--url",
            redis_server.url,
            "--read-only",
            "--port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.fullmatch(r"serving on (http://127\.0\.0\.1:\d+/)\n", line)
        assert match is not None, line
        url = match.group(1)
        page.goto(url + "locks")
        assert page.locator("#lock-rows tbody tr").count() == scene.held
        assert page.locator("a.action").count() == 0 and page.locator("form[method=post]").count() == 0
        assert "read-only" in page.locator("header").inner_text()
        forms: list[tuple[str, dict[str, str | float | bool]]] = [
            ("release", {"kind": "lock", "key": scene.orphan, "csrf": "x"}),
            ("discard-parked", {"key": scene.backlog, "csrf": "x"}),
        ]
        for action, form in forms:
            assert page.request.post(url + action, form=form).status == 403
        assert page.request.get(url + f"confirm/release?kind=lock&key={scene.orphan}").status == 403
        assert not store.read(scene.orphan).free
        after = ops.concurrency_key(scene.backlog, store)
        assert after is not None and after.parked == 2
    finally:
        proc.terminate()
        proc.wait(10)
