"""The dashboard over HTTP (Starlette's TestClient), on every store, and ``uniqjob dashboard`` for real."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("jinja2", reason="the dashboard extra is not installed")

from starlette.applications import Starlette
from starlette.testclient import TestClient

import uniqjob
from tests import dashboard_jobs
from tests.concurrency_jobs import Limited
from tests.dashboard_jobs import QUEUE, SCRIPT, Scene
from tests.redis_server import RedisServer
from tests.test_concurrency_jobs import dead_holder
from tests.test_ops import damaged
from tests.test_readme import _BLOCK
from uniqjob import ops
from uniqjob.concurrency import store_for
from uniqjob.dashboard import _data, create_app
from uniqjob.dashboard._format import duration
from uniqjob.locks import QueueMeta
from uniqjob.stores.base import Backend

ROOT = Path(__file__).resolve().parent.parent
DRAFT = ROOT / "docs" / "operations.md"


@pytest.fixture
def scene(backend: Backend) -> Iterator[Scene]:
    yield dashboard_jobs.build(backend)
    QUEUE.pushed.clear()


@pytest.fixture
def client(backend: Backend) -> TestClient:
    return TestClient(create_app(backend))


def text(page: str) -> str:
    """The page's text as a reader sees it: tags dropped, entities decoded, spaces folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def row_of(page: str, key: str) -> str:
    """The text of the table row of ``key``."""
    match = re.search(r'<tr data-key="' + re.escape(html.escape(key)) + r'".*?</tr>', page, re.S)
    assert match is not None, f"no row for {key!r}"
    return text(match.group())


def confirm_form(client: TestClient, url: str) -> tuple[str, dict[str, str]]:
    """GET a confirmation page; return its text and its first form's action and fields."""
    page = client.get(url)
    assert page.status_code == 200, page.text
    form = re.search(r'<form method="post" action="([^"]+)".*?</form>', page.text, re.S)
    assert form is not None, "the confirmation has no form"
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form.group()))
    return text(page.text), {
        "action": html.unescape(form.group(1)),
        **{k: html.unescape(v) for k, v in fields.items()},
    }


def post(client: TestClient, form: dict[str, str]) -> tuple[int, str]:
    fields = {k: v for k, v in form.items() if k != "action"}
    response = client.post(form["action"], data=fields)
    return response.status_code, text(response.text)


def lock_keys(page: str) -> list[str]:
    """The keys of the Uniqueness table's rows, in order."""
    table = page[page.index('id="lock-rows"') :] if 'id="lock-rows"' in page else ""
    return [html.unescape(k) for k in re.findall(r'<tr data-key="([^"]+)"', table)]


def link(page: str, label: str, key: str) -> str:
    """The href of the action ``label`` in ``key``'s row."""
    match = re.search(r'<tr data-key="' + re.escape(html.escape(key)) + r'".*?</tr>', page, re.S)
    assert match is not None
    found = re.search(r'<a class="action" href="([^"]+)">' + label + "</a>", match.group())
    assert found is not None, f"no {label} on {key!r}"
    return html.unescape(found.group(1))


# -- pages --------------------------------------------------------------------------------


def test_home_cards_total_every_key(client: TestClient, scene: Scene) -> None:
    page = client.get("/")
    assert page.status_code == 200
    shown = text(page.text)
    # parked: two behind account-1, one behind account-2
    assert re.search(r"Parked jobs 3 oldest waiting [\d.]+ s behind 3 concurrency key\(s\)", shown), shown
    assert "Locks 8 6 queued · 2 running · 1 orphaned" in shown
    assert 'href="/locks#concurrency"' in page.text


def test_home_counts_the_duplicates_dropped_in_the_last_hour(client: TestClient, scene: Scene) -> None:
    shown = text(client.get("/").text)
    assert (
        "Dropped duplicates 3 in the last hour 2 tests.dashboard_jobs.Report 1 tests.dashboard_jobs.Export"
        in shown
    )


def test_home_names_the_classes_that_drop_most(
    backend: Backend, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "Dropped duplicates 0 in the last hour: none" in text(client.get("/").text)
    dashboard_jobs.build(backend)
    monkeypatch.setattr(_data, "DROPS_SHOWN", 1)
    shown = text(client.get("/").text)
    assert "2 tests.dashboard_jobs.Report and 1 more class(es)" in shown


def test_home_counts_pending_calls_debounced_jobs_and_calls_coalesced_or_replaced(
    backend: Backend, client: TestClient
) -> None:
    def call(n: int) -> QueueMeta:
        return QueueMeta("app.Latest", f"({n},)", call=f'{{"a":[{n}],"k":{{}}}}')

    wait = (600.0, None)
    assert backend.claim("debounced", "t1", meta=call(1), debounce=wait) is None
    later = backend.claim("debounced", "t2", meta=call(2), count=True, coalesce="keep_last", debounce=wait)
    assert later is not None and later.coalesced == "latest"
    assert backend.claim("replaced", "t3", meta=call(3)) is None
    assert backend.claim("replaced", "t4", meta=call(4), count=True, coalesce="replace") is not None
    shown = text(client.get("/").text)
    assert "2 queued · 0 running · 0 orphaned · 1 debouncing" in shown
    assert "Dropped duplicates 0 in the last hour: none besides: 1 coalesced · 1 replaced" in shown


def test_metrics_are_the_stores_figures(backend: Backend, scene: Scene) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for app in (create_app(backend), create_app(backend, read_only=True)):
        response = TestClient(app).get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples
        }
        assert samples[("uniqjob_concurrency_parked_jobs", ())] == 3
        assert samples[("uniqjob_concurrency_slots_held", (("lease", "fresh"),))] == 2
        assert samples[("uniqjob_concurrency_slots_held", (("lease", "stale"),))] == 1
        assert samples[("uniqjob_concurrency_keys_at_limit", ())] == 3
        assert samples[("uniqjob_locks", (("state", "queued"),))] == 6
        assert samples[("uniqjob_locks", (("state", "running"),))] == 2
        assert samples[("uniqjob_locks_orphaned", ())] == 1
        for job, count in scene.drops:
            assert samples[("uniqjob_duplicates_total", (("job", job),))] == count


def test_metrics_without_prometheus_client_say_what_to_install(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "uniqjob.metrics", raising=False)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    response = TestClient(create_app(backend)).get("/metrics")
    assert response.status_code == 501
    assert "uniqjob.metrics needs prometheus_client: pip install 'uniqjob[metrics]'" in text(response.text)


def test_locks_page_concurrency_totals_and_rows(client: TestClient, scene: Scene) -> None:
    page = client.get("/locks").text
    shown = text(page)
    assert "Parked jobs 3 Oldest wait" in shown
    assert "Slots held 3 1 stale Keys at their limit 3 of 3 key(s)" in shown
    assert "keys beyond the 100 busiest are not shown" in shown
    # busiest first: most parked
    order = [
        m
        for m in re.findall(r'<tr data-key="([^"]+)"', page)
        if m.startswith("tests.dashboard_jobs.Export:acc")
    ]
    assert order == [scene.backlog, scene.blocked, scene.script]
    assert row_of(page, scene.backlog).startswith("1 / 1 fresh 2 ")
    blocked = row_of(page, scene.blocked)
    assert blocked.startswith("1 / 1 stale ⚠ stale slot blocks 1 parked 1 ")
    assert re.search(r'<tr data-key="' + re.escape(scene.blocked) + '" class="flagged"', page)
    assert 'class="flagged"' not in page.replace(f'<tr data-key="{scene.blocked}" class="flagged"', "")


def test_locks_page_uniqueness_rows_orphans_first(client: TestClient, scene: Scene) -> None:
    page = client.get("/locks").text
    keys = lock_keys(page)
    assert keys[0] == scene.orphan
    assert len(keys) == scene.held
    assert "Showing 8 of 8 held lock(s)" in text(page)
    orphan = row_of(page, scene.orphan)
    holder = f"{uniqjob.locks.local_holder().host}:"
    assert (
        orphan.startswith("running " + holder)
        and " yes job-2 tests.dashboard_jobs.Export 2, 'crashed' " in orphan
    )
    live = row_of(page, scene.live)
    assert live.startswith(f"running {holder}{uniqjob.locks.local_holder().pid} ")
    assert " no - app.jobs.Live 7 live-job" in live
    assert " no job-4 tests.dashboard_jobs.Report '2026-12-01' " in row_of(page, scene.report)


def test_the_class_filter_keeps_one_class(client: TestClient, scene: Scene) -> None:
    page = client.get("/locks", params={"class": "Report"}).text
    assert lock_keys(page) == [scene.report]
    assert "Showing 1 of 1 held lock(s) of class Report" in text(page)
    full = client.get("/locks", params={"class": "tests.dashboard_jobs.Export"}).text
    assert "Showing 6 of 6" in text(full)
    assert '<option value="tests.dashboard_jobs.Report">' in client.get("/locks").text


def test_a_script_in_an_argument_or_key_is_text(backend: Backend, client: TestClient, scene: Scene) -> None:
    backend.claim("<script>alert(1)</script>", "t", meta=QueueMeta("<b>Cls</b>", SCRIPT, "<i>id</i>"), ttl=60)
    page = client.get("/locks").text
    assert "<script>window" not in page and "<script>alert" not in page and "<b>Cls" not in page
    assert html.escape(SCRIPT, quote=False) in page or html.escape(SCRIPT) in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    headers = client.get("/locks").headers  # and were markup ever let through, no inline script would run
    assert "script-src 'self';" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    assert SCRIPT in text(page)


def test_rows_are_bounded_and_counts_are_not(
    backend: Backend, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(30):
        backend.claim(f"job-{n}", f"t{n}", meta=QueueMeta("app.Bulk", str(n)), ttl=600)
    monkeypatch.setattr(_data, "ROWS", 5)
    page = client.get("/locks").text
    assert len(re.findall(r'<tr data-key="job-', page)) == 5
    assert "Showing 5 of 30 held lock(s)" in text(page)
    found = _data.uniqueness(backend, limit=5)
    assert (found.held, found.queued, len(found.rows)) == (30, 30, 5)


def test_only_the_busiest_keys_are_listed_the_totals_count_all(
    backend: Backend, client: TestClient, scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_data, "TOP", 1)
    page = client.get("/locks").text
    assert [k for k in re.findall(r'<tr data-key="([^"]+)"', page) if ":account-" in k] == [scene.backlog]
    assert "keys beyond the 1 busiest are not shown: 2 key(s) not shown" in text(page)
    assert "Parked jobs 3" in text(page)


def test_an_empty_store(client: TestClient) -> None:
    assert "No concurrency slots held, no jobs parked." in text(client.get("/locks").text)
    assert "No locks held." in text(client.get("/locks").text)
    assert "Parked jobs 0 oldest waiting -" in text(client.get("/").text)


# -- actions ------------------------------------------------------------------------------


def test_release_of_a_live_holder_warns_more_strongly(client: TestClient, scene: Scene) -> None:
    live, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.live))
    assert "a job is probably still running; releasing lets another start beside it" in live
    assert form["force"] == "1"
    queued, queued_form = confirm_form(client, link(client.get("/locks").text, "Release", scene.report))
    assert "probably still running" not in queued and "job job-4" in queued
    assert queued_form["force"] == "0"
    orphan, _ = confirm_form(client, link(client.get("/locks").text, "Release", scene.orphan))
    assert "orphaned" in orphan and "probably still running" not in orphan
    status, done = post(client, form)
    assert status == 200 and f"Released the locks of {scene.live}" in done
    assert scene.live not in client.get("/locks").text


def test_release_of_a_fresh_concurrency_slot_warns_and_promotes_the_oldest(
    backend: Backend, client: TestClient, scene: Scene
) -> None:
    shown, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.backlog))
    assert "a job is probably still running; releasing lets another start beside it" in shown
    assert "up to 2 may run at once (limit 1)" in shown
    QUEUE.pushed.clear()
    status, done = post(client, form)
    assert status == 200 and "Released 1 slot(s)" in done and "promoted 1 parked" in done
    assert "1 of them had a fresh lease" in done
    assert [entry[3] for entry in QUEUE.pushed] == [(1, "second")]  # the oldest parked, pushed
    after = ops.concurrency_key(scene.backlog, backend)
    assert after is not None and (after.held, after.parked) == (1, 1)


def test_release_of_a_stale_slot_frees_only_it(backend: Backend, client: TestClient, scene: Scene) -> None:
    shown, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.blocked))
    assert "probably still running" not in shown and "Frees the 1 stale slot(s)" in shown
    assert form["force"] == "0"
    QUEUE.pushed.clear()
    status, done = post(client, form)
    assert status == 200 and "Released 1 slot(s)" in done and "promoted 1 parked" in done
    assert [entry[3] for entry in QUEUE.pushed] == [(2, "waiting")]
    after = ops.concurrency_key(scene.blocked, backend)
    assert after is not None and (after.stale, after.fresh, after.parked) == (0, 1, 0)


def test_discard_parked_says_how_many_will_never_run(
    backend: Backend, client: TestClient, scene: Scene
) -> None:
    shown, form = confirm_form(client, link(client.get("/locks").text, "Discard parked", scene.backlog))
    assert "2 parked job(s) will never run" in shown
    status, done = post(client, form)
    assert status == 200 and "Discarded 2 parked job(s)" in done
    after = ops.concurrency_key(scene.backlog, backend)
    assert after is not None and after.parked == 0 and after.held == 1
    assert not dashboard_jobs.Export.is_locked(1, "second")  # their uniqueness locks went too
    again = client.post(form["action"], data={k: v for k, v in form.items() if k != "action"})
    assert again.status_code == 409 and "nothing discarded" in text(again.text)


def test_a_mixed_key_offers_to_free_only_its_stale_slots(backend: Backend, client: TestClient) -> None:
    uniqjob.configure(backend)
    Limited.enqueue(5, 0)  # a fresh slot: its job waits in its queue
    key = Limited.semaphore(5).key
    dead = dead_holder()
    taken = store_for(backend).acquire(
        key,
        "crashed",
        limit=2,
        lease=600,
        running=True,
        holder=dead,
        park=None,
        job_class="",
        args="",
        caller=dead,
    )
    assert taken.status == "taken"
    page = client.get("/confirm/release", params={"kind": "concurrency", "key": key}).text
    assert "1 of its 2 slot(s) have a fresh lease: a job is probably still running" in text(page)
    forms = re.findall(r'<form method="post".*?</form>', page, re.S)
    assert [re.search(r'name="force" value="(\d)"', f).group(1) for f in forms] == ["1", "0"]  # type: ignore[union-attr]
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', forms[1]))
    done = client.post("/release", data={k: html.unescape(v) for k, v in fields.items()})
    assert done.status_code == 200
    assert "Released 1 slot(s)" in text(done.text) and "Kept 1 slot(s) whose lease is fresh" in text(
        done.text
    )
    after = ops.concurrency_key(key, backend)
    assert after is not None and (after.fresh, after.stale) == (1, 0)


def test_an_unreadable_record_is_shown_first_and_removed_by_force(
    backend: Backend, client: TestClient, scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = damaged(backend, "torn-key", monkeypatch)
    page = client.get("/locks").text
    assert lock_keys(page)[0] == "torn-key"
    assert row_of(page, "torn-key").startswith(f"corrupt - - - - - - - unreadable: torn ({error.path})")
    assert "Unreadable 1" in text(page) and "1 unreadable" in text(client.get("/").text)
    shown, form = confirm_form(client, link(page, "Release", "torn-key"))
    assert "Its record cannot be read (torn" in shown and form["force"] == "1"
    status, done = post(client, form)
    assert status == 200 and "Removed the unreadable record of torn-key" in done


def test_posts_need_their_own_token(backend: Backend, client: TestClient, scene: Scene) -> None:
    _, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.report))
    fields = {k: v for k, v in form.items() if k != "action"}
    for bad in (
        {**fields, "csrf": ""},
        {**fields, "csrf": "0" * 64},
        {k: v for k, v in fields.items() if k != "csrf"},
    ):
        refused = client.post("/release", data=bad)
        assert refused.status_code == 403 and "Missing or bad CSRF token" in text(refused.text)
    # a token is for one key and one action
    assert client.post("/release", data={**fields, "key": scene.live}).status_code == 403
    assert client.post("/discard-parked", data=fields).status_code == 403
    other = TestClient(create_app(backend))  # each application has its own secret
    assert other.post("/release", data=fields).status_code == 403
    assert not backend.read(scene.report).free
    assert client.get("/release").status_code == 405  # never by GET
    assert client.post("/release", data={"csrf": "x"}).status_code == 400


def test_read_only_offers_nothing_and_refuses_posts(
    backend: Backend, client: TestClient, scene: Scene
) -> None:
    _, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.report))
    viewer = TestClient(create_app(backend, read_only=True))
    page = viewer.get("/locks").text
    assert 'class="action"' not in page and "Actions" not in page and "read-only" in page
    assert scene.report in page
    assert viewer.get("/confirm/release", params={"kind": "lock", "key": scene.report}).status_code == 403
    refused = viewer.post("/release", data={k: v for k, v in form.items() if k != "action"})
    assert refused.status_code == 403 and "read-only" in text(refused.text)
    assert viewer.post("/discard-parked", data={"key": scene.backlog}).status_code == 403
    assert not backend.read(scene.report).free


def test_a_key_released_meanwhile(backend: Backend, client: TestClient, scene: Scene) -> None:
    _, form = confirm_form(client, link(client.get("/locks").text, "Release", scene.report))
    assert ops.release(scene.report, backend) is not None
    status, done = post(client, form)
    assert status == 409 and f"Nothing is held on {scene.report}" in done
    gone = client.get("/confirm/release", params={"kind": "lock", "key": scene.report})
    assert "Nothing is held on this key any more." in text(gone.text)
    bad = client.get("/confirm/release", params={"kind": "thing", "key": "x"})
    assert bad.status_code == 400 and "Unknown kind 'thing'" in text(bad.text)


def test_the_configured_store_is_read_at_each_request(backend: Backend) -> None:
    client = TestClient(create_app())
    uniqjob.configure(backend)
    backend.claim("mine", "t", meta=QueueMeta("app.Mine"), ttl=60)
    assert "mine" in client.get("/locks").text


def test_an_unreachable_store_is_a_503_that_says_so(redis_server: RedisServer) -> None:
    with RedisServer() as doomed:
        url = doomed.url
    client = TestClient(create_app(uniqjob.config.resolve(url)))
    page = client.get("/")
    assert page.status_code == 503 and "Lock store unavailable" in text(page.text)


def test_semaphore_store_drives_the_same_figures(backend: Backend, client: TestClient, scene: Scene) -> None:
    """The page's figures are ops' figures: no second count of its own."""
    report = ops.concurrency(backend, top=100)
    page = text(client.get("/locks").text)
    assert f"Slots held {report.totals.slots_held} {report.totals.stale_slots} stale" in page
    assert len(list(store_for(backend).scan())) == report.totals.keys


# -- mounting, and the command ------------------------------------------------------------


def test_the_mounting_guide_runs_under_its_prefix_behind_its_auth(
    redis_server: RedisServer, redis_client: object
) -> None:
    blocks = [
        m.group(3)
        for m in _BLOCK.finditer(DRAFT.read_text())
        if not m.group(1) and "admins_only" in m.group(3)
    ]
    assert blocks, "no runnable block in the guide"
    namespace: dict[str, object] = {"__name__": "guide"}
    for block in blocks:
        exec(
            compile(block.replace("redis://localhost:6379/0", redis_server.url), str(DRAFT), "exec"),
            namespace,
        )
    app = namespace["app"]
    assert isinstance(app, Starlette)
    uniqjob.config.resolve(redis_server.url).claim("k", "t", meta=QueueMeta("app.Mounted"), ttl=60)
    client = TestClient(app)
    assert client.get("/admin/uniqjob/locks").status_code == 401
    auth = {"Authorization": str(namespace["ADMIN"])}
    page = client.get("/admin/uniqjob/locks", headers=auth)
    assert page.status_code == 200 and "app.Mounted" in page.text
    assert 'href="/admin/uniqjob/confirm/release?kind=lock&amp;key=k"' in page.text
    assert '<script src="/admin/uniqjob/static/dashboard.js"' in page.text
    assert client.get("/admin/uniqjob/static/dashboard.js", headers=auth).status_code == 200


def test_the_django_example_routes_its_prefix_to_the_dashboard(
    redis_server: RedisServer, redis_client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("django", reason="Django is not installed")
    import types

    from django.conf import settings  # type: ignore[import-untyped]
    from django.http import HttpResponse  # type: ignore[import-untyped]
    from django.urls import path  # type: ignore[import-untyped]

    urls = types.ModuleType("dashboard_django_urls")
    urls.urlpatterns = [path("hello", lambda request: HttpResponse("django here"))]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, urls.__name__, urls)
    if not settings.configured:
        settings.configure(ROOT_URLCONF=urls.__name__, ALLOWED_HOSTS=["testserver"], SECRET_KEY="test")
    # The example sets DJANGO_SETTINGS_MODULE: set here, so the test's end takes it out of the
    # environment again (a Celery worker started later would otherwise look for "mysite").
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "mysite.settings")
    (block,) = [m.group(3) for m in _BLOCK.finditer(DRAFT.read_text()) if "django" in m.group(3)]
    namespace: dict[str, object] = {"__name__": "asgi"}
    exec(compile(block.replace("redis://localhost:6379/0", redis_server.url), str(DRAFT), "exec"), namespace)
    uniqjob.config.resolve(redis_server.url).claim("k", "t", meta=QueueMeta("app.InDjango"), ttl=60)
    client = TestClient(namespace["application"])  # type: ignore[arg-type]
    page = client.get("/admin/uniqjob/locks")
    assert page.status_code == 200 and "app.InDjango" in page.text
    assert 'href="/admin/uniqjob/confirm/release?kind=lock&amp;key=k"' in page.text
    assert client.get("/hello").text == "django here"


def _serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``uniqjob dashboard`` with ``args``; return it and the URL of its first stderr line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "uniqjob", "dashboard", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = re.fullmatch(r"serving on (http://127\.0\.0\.1:\d+/)\n", line)
    assert match is not None, line + proc.stderr.read()
    return proc, match.group(1)


def test_the_command_serves_read_only(redis_server: RedisServer, redis_client: object) -> None:
    import httpx2 as httpx

    backend = uniqjob.config.resolve(redis_server.url)
    backend.claim("served", "t", meta=QueueMeta("app.Served", "<script>"), ttl=60)
    proc, url = _serve("--url", redis_server.url, "--read-only")
    try:
        page = httpx.get(url + "locks", timeout=10)
        assert page.status_code == 200 and "app.Served" in page.text and "&lt;script&gt;" in page.text
        assert 'class="action"' not in page.text
        refused = httpx.post(url + "release", data={"kind": "lock", "key": "served", "csrf": "x"}, timeout=10)
        assert refused.status_code == 403
        assert not backend.read("served").free
    finally:
        proc.terminate()
        proc.wait(10)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False, timeout=60)


def test_the_command_refuses_a_bad_port_and_a_busy_one() -> None:
    bad = _run("-m", "uniqjob", "dashboard", "--port", "70000")
    assert bad.returncode == 64 and "expected a port number 0-65535, got '70000'" in bad.stderr
    proc, url = _serve()
    try:
        port = url.rsplit(":", 1)[1].rstrip("/")
        busy = _run("-m", "uniqjob", "dashboard", "--port", port)
        assert busy.returncode == 64 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_command_without_the_extra_says_what_to_install() -> None:
    code = "import sys; sys.modules['uvicorn'] = None; from uniqjob.cli import main; main(['dashboard'])"
    done = _run("-c", code.replace("main([", "sys.exit(main([") + ")")
    assert done.returncode == 78
    assert "uniqjob dashboard needs the dashboard extra (uvicorn is missing)" in done.stderr
    assert "pip install 'uniqjob[dashboard]'" in done.stderr


def test_the_command_is_listed_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    from uniqjob.cli import main

    assert main(["--help"]) == 0
    assert "dashboard" in capsys.readouterr().out
    assert main(["dashboard", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "usage: uniqjob dashboard [-h] [--url URL] [--namespace NAME] [--host HOST] [--port PORT] "
        "[--read-only]" in out
    )
    assert "serving on http://HOST:PORT/" in out and "uniqjob dashboard --read-only" in out


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (4.25, "4.2 s"),
        (60, "1 min 00 s"),
        (185.5, "3 min 05 s"),
        (7385, "2 h 03 min"),
        (90000, "1 d 01 h"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float | None, shown: str) -> None:
    assert duration(seconds) == shown
