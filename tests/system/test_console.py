"""The console's read side on a real ``kenning console`` process and real PostgreSQL: the
instances list (filters, keyset pages, counts), one instance's page, live updates by
server-sent events, the admin token, and clear 400 pages for bad query parameters."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import httpx
import psycopg
import pytest
import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kenning import Client
from kenning.storage import console as console_sql
from kenning.storage.console import Cursor, InstanceFilters
from kenning_console.app import create_app
from kenning_console.security import WRONG_TOKEN_DELAY, session_value
from kenning_console.settings import ConsoleSettings
from tests.console_support import console_ready, csrf_token, own_origin, spawn_console
from tests.logguard import expect_log
from tests.support import REPO_ROOT, ProcessPool, eventually, free_port

APP = "tests.apps.console"
TOKEN = "console-test-token-4f1c"
BEARER = {"authorization": f"Bearer {TOKEN}"}

# 30 instances one minute apart, newest last: workflows alternate, every third failed
_SEED = """
INSERT INTO kenning_instances (id, workflow_name, status, input, result, idempotency_key, created_at, updated_at)
SELECT 'seed-' || lpad(g::text, 3, '0'),
       CASE WHEN g % 2 = 0 THEN 'seed.even' ELSE 'seed.odd' END,
       CASE WHEN g % 3 = 0 THEN 'failed' ELSE 'completed' END,
       jsonb_build_object('order', jsonb_build_object('n', g), 'customer', 'Cust-' || (g % 4)),
       CASE WHEN g % 3 <> 0 THEN jsonb_build_object('total', g * 10) END,
       'order-' || g,
       timestamptz '2030-01-01 00:00:00+00' + g * interval '1 minute',
       now()
FROM generate_series(1, 30) AS g
"""


def _ids(html: str) -> list[str]:
    return re.findall(r'<td class="id" data-label="Instance"><a href="[^"]+">([^<]+)</a>', html)


def _next(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return found.group(1).replace("&amp;", "&") if found else None


@pytest.fixture
def seeded(sql: psycopg.Connection[Any]) -> None:
    sql.execute(_SEED)


async def test_list_storage_pages_filters_and_bounded_search(database: Any, seeded: None) -> None:
    """Keyset pages cover every row once, newest first; a search judges at most
    scan_limit rows per page and says where to go on."""
    async with database.connection() as conn:
        seen: list[str] = []
        after: Cursor | None = None
        while True:
            page = await console_sql.instances_page(conn, InstanceFilters(), after=after, limit=7, scan_limit=100)
            seen += [row.id for row in page.rows]
            if page.next is None:
                break
            after = page.next
        assert seen == [f"seed-{n:03d}" for n in range(30, 0, -1)]

        failed_odd = await console_sql.instances_page(
            conn, InstanceFilters(status="failed", workflow="seed.odd"), after=None, limit=50, scan_limit=100
        )
        assert [row.id for row in failed_odd.rows] == ["seed-027", "seed-021", "seed-015", "seed-009", "seed-003"]

        # a search for one instance, 4 rows judged per page: the pages go on until it is found
        contains = json.dumps({"order": {"n": 2}})
        after, found, pages = None, [], 0
        while True:
            page = await console_sql.instances_page(
                conn, InstanceFilters(contains=contains), after=after, limit=5, scan_limit=4
            )
            pages += 1
            found += [row.id for row in page.rows]
            if page.next is None:
                break
            assert page.rows or page.scanned == 4
            after = page.next
        assert found == ["seed-002"]
        assert pages == 8  # 30 rows, 4 judged per page

        counts = await console_sql.instances_counts(conn, InstanceFilters(workflow="seed.even"), cap=3)
        assert counts["failed"] == 3  # 5 even failed, counted up to the cap
        assert counts["completed"] == 3
        assert counts["running"] == 0


async def test_list_pages_filters_token_and_bad_parameters(
    processes: ProcessPool, database_url: str, seeded: None
) -> None:
    """One console (with an admin token) for the list's pages and filters, the clear 400
    pages, and the token's enforcement (one process start, not three)."""
    url, proc = spawn_console(processes, database_url, token=TOKEN, env={"KENNING_CONSOLE_PAGE_SIZE": "12"})
    await console_ready(url, proc)
    await _list_pages_and_filters(url)
    await _bad_query_parameters(url)
    await _admin_token(url)
    assert "Traceback" not in processes.log_of(proc)


async def _list_pages_and_filters(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=BEARER) as client:
        first = await client.get("/instances")
        assert first.status_code == 200
        assert "script-src 'self'" in first.headers["content-security-policy"]
        assert "<script>" not in first.text and " style=" not in first.text  # nothing inline: the CSP allows none
        assert _ids(first.text) == [f"seed-{n:03d}" for n in range(30, 18, -1)]
        second = await client.get(_next(first.text) or "")
        third = await client.get(_next(second.text) or "")
        assert _ids(second.text) == [f"seed-{n:03d}" for n in range(18, 6, -1)]
        assert _ids(third.text) == [f"seed-{n:03d}" for n in range(6, 0, -1)]
        assert _next(third.text) is None
        assert 'data-count="failed">10<' in first.text and 'data-count="completed">20<' in first.text

        async def ids(**params: str) -> list[str]:
            response = await client.get("/instances", params=params)
            assert response.status_code == 200, response.text
            return _ids(response.text)

        assert await ids(status="failed", workflow="seed.even") == [
            "seed-030",
            "seed-024",
            "seed-018",
            "seed-012",
            "seed-006",
        ]
        assert await ids(since="2030-01-01T00:05", until="2030-01-01T00:08") == ["seed-007", "seed-006", "seed-005"]
        assert await ids(id="seed-017") == ["seed-017"]
        assert await ids(id="seed-01") == [f"seed-{n:03d}" for n in range(19, 9, -1)]
        assert await ids(key="order-2") == [f"seed-{n:03d}" for n in (*range(29, 19, -1), 2)]
        assert await ids(q="order.n=12") == ["seed-012"]
        assert await ids(q="total=40") == ["seed-004"]
        assert await ids(q="cust-3") == [f"seed-{n:03d}" for n in range(30, 0, -1) if n % 4 == 3][:12]


async def _bad_query_parameters(url: str) -> None:
    cases = {
        "status=finished": "is not a status",
        "since=yesterday": "is not a time",
        "since=2030-01-02T00:00&until=2030-01-01T00:00": "since must be before until",
        "after=not-a-cursor": "not a page position",
        "limit=0": "from 1 to 500",
        "limit=%C2%B2": "from 1 to 500",  # a digit to str.isdigit, not to int()
        "q=" + "x" * 300: "longer than 200",
        "q=a%3DNaN": "NaN is not a JSON value",
        "q=a%3DInfinity": "Infinity is not a JSON value",
        "q=a%3D%22%5Cu0000%22": "NUL",  # a="\u0000": no jsonb holds it
        "after=" + _cursor("2030-01-01T00:00:00+00:00", "\x00"): "not a page position",
    }
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=BEARER) as client:
        for query, message in cases.items():
            response = await client.get(f"/instances?{query}")
            assert response.status_code == 400, query
            assert message in response.text and 'role="alert"' in response.text, query
            assert "Traceback" not in response.text
        for query, message in {
            "type=%00": "NUL",
            "before=%C2%B2": "row number",
        }.items():
            response = await client.get(f"/events/inbox?{query}")
            assert response.status_code == 400 and message in response.text, query
        missing = await client.get("/instances/no-such-instance")
        assert missing.status_code == 404 and "no instance" in missing.text
        # a NUL in an id (PostgreSQL's text holds none), a unicode digit as a row number
        for method, path in [
            ("GET", "/instances/%00"),
            ("GET", "/instances/%00/cancel"),
            ("POST", "/instances/%00/cancel"),
            ("GET", "/instances/%00/retry"),
            ("POST", "/instances/%00/retry"),
            ("GET", "/live/%00"),
            ("GET", "/events/inbox/%C2%B2/retry"),
            ("GET", "/live/no-such-instance"),  # nothing to watch: no stream open for ever
        ]:
            response = await client.request(method, path)
            assert response.status_code == 404, (method, path, response.status_code)


def _cursor(created_at: str, instance_id: str) -> str:
    """An ``after=`` page position as the console encodes one (kenning_console.instances)."""
    raw = json.dumps([created_at, instance_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_instance_page_of_a_compensated_saga_and_its_live_updates(
    processes: ProcessPool, database_url: str, sql: psycopg.Connection[Any], side_channel: str
) -> None:
    """A saga waits; its page streams a ``changed`` event when it is cancelled; then the
    page shows the compensation that ran, the event it sent, the wait gone."""
    processes.worker(database_url, APP)
    url, proc = spawn_console(processes, database_url, app=APP, token=TOKEN, env={"KENNING_CONSOLE_MAX_STREAMS": "1"})
    await console_ready(url, proc)
    async with Client(database_url) as kenning:
        started = await kenning.start("shop.order", idempotency_key="live-1", order_id="o-live", quantity=2)
        instance_id = started.instance_id

        async with httpx.AsyncClient(base_url=url, timeout=10, headers=BEARER) as client:

            def waiting() -> bool:
                query = "SELECT 1 FROM kenning_event_subscriptions WHERE instance_id = %s"
                return sql.execute(query, (instance_id,)).fetchone() is not None

            await eventually(waiting, timeout=15, interval=0.05, message="the saga waits for its payment")
            page = (await client.get(f"/instances/{instance_id}")).text
            assert "&#34;order_id&#34;: &#34;o-live&#34;" in page  # the match, escaped
            assert "not run" in page  # release_stock registered, not run yet

            events: list[tuple[str, str]] = []

            async def listen() -> None:
                async with client.stream("GET", f"/live/{instance_id}", timeout=20) as stream:
                    assert stream.headers["content-type"].startswith("text/event-stream")
                    name = ""
                    async for line in stream.aiter_lines():
                        if line.startswith("event: "):
                            name = line[7:]
                        elif line.startswith("data: "):
                            events.append((name, line[6:]))
                            if name == "changed" and '"cancelled"' in line:
                                return

            listener = asyncio.create_task(listen())
            await eventually(lambda: events, timeout=10, message="the stream says hello")
            assert events[0][0] == "hello" and '"waiting_for_event"' in events[0][1]
            over_cap = await client.get(f"/live/{instance_id}")  # one stream is the most this console serves
            assert over_cap.status_code == 503 and "live-update streams" in over_cap.text
            assert await kenning.cancel(instance_id)
            await asyncio.wait_for(listener, timeout=15)
            assert events[-1][0] == "changed"

            page = (await client.get(f"/instances/{instance_id}")).text
    assert 'class="status status-cancelled"' in page
    assert "compensated" in page and "release_stock" in page  # the compensation and its outcome
    assert "reserve_stock" in page and "stock.reserved" in page  # the step and the event it sent
    assert '<dt>source</dt><dd class="mono">/console-tests</dd>' in page  # its CloudEvent attributes
    assert "waits for" not in page  # the wait is over
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in page and '<title id="diagram-title">' in page


async def _admin_token(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as anonymous:
        assert (await anonymous.get("/instances")).status_code == 401
        assert (await anonymous.get("/live/x")).status_code == 401
        page = await anonymous.get("/instances?status=failed", headers={"accept": "text/html"})
        assert page.status_code == 303 and page.headers["location"] == "/login?next=%2Finstances%3Fstatus%3Dfailed"
        assert (await anonymous.get("/instances", headers={"authorization": "Bearer wrong"})).status_code == 401
        assert (await anonymous.get("/instances", headers=BEARER)).status_code == 200
        assert (await anonymous.get("/static/console.css")).status_code == 200  # the login page's style
        for near in ("/loginx", "/healthz/x", "/static"):  # public paths are exact ones
            assert (await anonymous.get(near)).status_code == 401, near
        # another localhost app's cookie SimpleCookie cannot read: the ones after it still count
        prefs = 'prefs={"theme": "dark"}'
        session = await anonymous.get(
            "/instances", headers={"cookie": f"{prefs}; kenning_session={session_value(TOKEN)}"}
        )
        assert session.status_code == 200
        await _session_lifetime(anonymous)
        csrf = "c" * 43
        kept = await anonymous.get("/healthz", headers={"cookie": f"{prefs}; kenning_csrf={csrf}"})
        assert "set-cookie" not in kept.headers  # the browser's CSRF cookie is read, not replaced

    async with httpx.AsyncClient(base_url=url, timeout=10) as browser:
        form = await browser.get("/login?next=/instances%3Fstatus%3Dfailed")
        assert form.status_code == 200 and 'type="password"' in form.text
        csrf = await csrf_token(browser)
        browser.headers["origin"] = own_origin(browser)  # as a browser sends with every form
        started = time.monotonic()
        wrong = await browser.post("/login", data={"csrf_token": csrf, "token": "guess", "next": "/instances"})
        assert wrong.status_code == 401 and "not the admin token" in wrong.text
        assert time.monotonic() - started >= WRONG_TOKEN_DELAY  # a guess is answered slowly
        forged = await browser.post("/login", data={"csrf_token": "forged" * 8, "token": TOKEN})
        assert forged.status_code == 403
        login = await browser.post("/login", data={"csrf_token": csrf, "token": TOKEN, "next": "https://evil.example/"})
        assert login.status_code == 303 and login.headers["location"] == "/"  # never off-site
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        assert "Max-Age=43200" in cookie  # --console-session-hours' 12 by default
        stamp, _, mac = browser.cookies["kenning_session"].partition(".")
        assert abs(int(stamp) - time.time()) < 60 and len(mac) == 64  # issued now, a SHA-256 HMAC
        assert (await browser.get("/instances")).status_code == 200
        # the token is bound to the session: the one from before the login no longer counts
        assert (await browser.post("/logout", data={"csrf_token": csrf})).status_code == 403
        logout = await browser.post("/logout", data={"csrf_token": await csrf_token(browser)})
        assert logout.status_code == 303
        assert (await browser.get("/instances")).status_code == 401


async def _session_lifetime(client: httpx.AsyncClient) -> None:
    """A session cookie is refused once older than --console-session-hours (12 by default)
    or when any part of it is changed; it never holds the token."""
    now = int(time.time())

    async def status(cookie: str) -> int:
        response = await client.get("/instances", headers={"cookie": f"kenning_session={cookie}"})
        return response.status_code

    fresh = session_value(TOKEN, now - 11 * 3600)
    assert TOKEN not in fresh and await status(fresh) == 200
    expired = session_value(TOKEN, now - 12 * 3600 - 60)
    assert await status(expired) == 401
    stamp, _, mac = expired.partition(".")
    assert await status(f"{now}.{mac}") == 401  # re-dated: its HMAC no longer matches
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    assert await status(f"{fresh.partition('.')[0]}.{flipped}") == 401
    assert await status(session_value(TOKEN + "x", now)) == 401  # made with another token
    assert await status(session_value(TOKEN, now + 3600)) == 401  # dated ahead: would outlive its hours
    for junk in ("", ".", fresh.partition(".")[2], f"-1.{mac}", f"{stamp}x.{mac}"):
        assert await status(junk) == 401, junk
    page = await client.get("/instances", headers={"cookie": f"kenning_session={expired}", "accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
    started = time.monotonic()
    assert (await client.get("/instances", headers={"authorization": "Bearer guess"})).status_code == 401
    assert time.monotonic() - started >= WRONG_TOKEN_DELAY  # a wrong bearer token is a guess too


async def test_a_console_without_its_database_answers_503_and_stays_up(processes: ProcessPool) -> None:
    """PostgreSQL unreachable (a closed port): each page says so with 503 and one warning
    line, no traceback, no error-level line (the log guard checks), the console stays up."""
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    url, proc = spawn_console(processes, closed, env={"KENNING_DATABASE_TIMEOUT": "1"})
    await console_ready(url, proc)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for path in ("/instances", "/instances/x", "/live/x", "/events/inbox"):
            response = await client.get(path)
            assert response.status_code == 503, (path, response.status_code)
            assert "database" in response.text and 'role="alert"' in response.text
        # an open console answers only to loopback names: a page rebound to 127.0.0.1 gets nothing
        rebound = await client.get("/instances", headers={"host": "evil.example"})
        assert rebound.status_code == 400 and "answers only to localhost" in rebound.text
        assert (await client.get("/healthz", headers={"host": "localhost:9"})).status_code == 200
        assert (await client.get("/healthz", headers={"host": "[::1]:9"})).status_code == 200
    log = processes.log_of(proc)
    assert "Traceback" not in log and log.count('"console.database_unavailable"') == 4


async def test_an_unexpected_error_is_one_page_and_one_line_not_raised_on() -> None:
    """A handler's exception: the 500 page, one ``console.internal_error`` line, and not
    raised on to the server (uvicorn would log it again as a plain-text traceback)."""
    expect_log("console.internal_error")
    app = create_app(ConsoleSettings(database_url="postgresql://nobody@127.0.0.1:1/none"))

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    app.router.routes.insert(0, Route("/broken", broken))
    transport = httpx.ASGITransport(app=app)  # raises what the app raises on
    with structlog.testing.capture_logs() as logged:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            response = await client.get("/broken")
    assert response.status_code == 500 and "the details are in its log" in response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert [entry["event"] for entry in logged] == ["console.internal_error"]


def _contrast(colour: str) -> float:
    """WCAG contrast of ``#rrggbb`` against white."""

    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else float(((c + 0.055) / 1.055) ** 2.4)

    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    luminance = 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)
    return 1.05 / (luminance + 0.05)


def test_the_timeline_dots_stand_out_from_the_page() -> None:
    """The dots carry an outcome: as graphics they need 3:1 against the white page."""
    css = (REPO_ROOT / "services/console/kenning_console/static/console.css").read_text()
    colours = dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{6})", css))
    dots = re.findall(r"ol\.timeline > li[\w.]*::before \{[^}]*?background: ([^;]+);", css)
    assert len(dots) == 4, dots
    for value in dots:
        colour = colours[value[6:-1]] if value.startswith("var(--") else value
        assert _contrast(colour) >= 3, (value, _contrast(colour))
