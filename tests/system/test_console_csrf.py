"""The console's forms against a page of another origin (issue 25, item 6).

A page on another port of the same host is same-site: the browser sends the console's
``SameSite=Strict`` cookies with its form, and it can set cookies for the console's host
(ports do not separate cookies). So it could plant a ``kenning_csrf`` cookie of its own
choosing and submit a form carrying the same value: the double-submit check took it, and
the instance was cancelled. Now the token is an HMAC of the browser's cookies with the
console's secret, and every state-changing request must come from the console's own
origin. Tested in a real Chromium against a real second origin (a little HTTP server of
the test's own), and request by request with httpx.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psycopg
import pytest
from playwright.async_api import async_playwright

from tests.console_support import console_ready, csrf_token, own_origin, post_form, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, free_port
from tests.system.test_console_browser import CHROMIUM, CHROMIUM_ARGS

Sql = psycopg.Connection[tuple[object, ...]]
PLANTED = "planted-by-another-page-0123456789abcdef"  # long enough to pass for the console's own


def _waiting_instance(sql: Sql, instance_id: str) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, created_at, updated_at) "
        "VALUES (%s, 'shop.order', 'waiting_for_event', '{}', now(), now())",
        [instance_id],
    )


def _cancel_requested(sql: Sql, instance_id: str) -> bool:
    row = sql.execute("SELECT cancel_requested FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
    assert row is not None
    return bool(row[0])


def _attack_page(console_url: str, instance_id: str) -> bytes:
    """What the other origin serves: a form to the console's cancel action that sends
    itself, carrying the token the page planted as the console's CSRF cookie."""
    return f"""<!doctype html><html><body>
<form id="f" method="post" action="{console_url}/instances/{instance_id}/cancel">
<input type="hidden" name="csrf_token" value="{PLANTED}"></form>
<script>document.getElementById("f").submit();</script>
</body></html>""".encode()


@contextlib.contextmanager
def other_origin(page: bytes) -> Iterator[str]:
    """A real HTTP server on another port of 127.0.0.1: it sets the console's CSRF cookie to
    ``PLANTED`` (as a Set-Cookie of its own host, which the console shares) and serves ``page``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("set-cookie", f"kenning_csrf={PLANTED}; Path=/; HttpOnly")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM}")
async def test_a_page_of_another_port_cannot_cancel_through_an_open_console(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    expect_log("console.cross_origin_refused")
    _waiting_instance(sql, "target-1")
    url, console = spawn_console(processes, database_url)  # open: no token, as on a laptop
    await console_ready(url, console)
    with other_origin(_attack_page(url, "target-1")) as attacker:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                await page.goto(f"{url}/instances/target-1")  # the operator has the console open
                async with page.expect_response(f"{url}/instances/target-1/cancel") as attacked:
                    await page.goto(attacker)  # then visits the other page, which submits itself
                answer = await attacked.value
                assert answer.status == 403, f"the other page's cancel was answered {answer.status}"
                assert "another site's page" in await answer.text()
                cookies = {c["name"]: c["value"] for c in await page.context.cookies(url)}
                assert cookies["kenning_csrf"] == PLANTED  # the plant took: the browser sends it
                assert not _cancel_requested(sql, "target-1")

                # the console's own page still cancels, with the planted cookie in the browser
                await page.goto(f"{url}/instances/target-1/cancel")
                await page.get_by_role("button", name="Cancel the instance").click()
                await page.wait_for_url(f"{url}/instances/target-1")
                assert _cancel_requested(sql, "target-1")
            finally:
                await browser.close()
    log = processes.log_of(console)
    assert '"console.cross_origin_refused"' in log and "Sec-Fetch-Site: same-site" in log


async def test_a_state_changing_request_must_come_from_the_console_with_its_session_token(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    expect_log("console.cross_origin_refused")
    _waiting_instance(sql, "target-2")
    url, console = spawn_console(processes, database_url)
    await console_ready(url, console)
    cancel = "/instances/target-2/cancel"
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        token = await csrf_token(client)
        own = own_origin(client)

        async def refused(headers: dict[str, str], fields: dict[str, str] | None = None) -> str:
            answer = await client.post(cancel, data=fields or {"csrf_token": token}, headers=headers)
            assert answer.status_code == 403, (headers, answer.status_code)
            return answer.text

        assert "another site's page (Sec-Fetch-Site: cross-site)" in await refused(
            {"origin": own, "sec-fetch-site": "cross-site"}
        )
        assert "(Sec-Fetch-Site: same-site)" in await refused({"origin": own, "sec-fetch-site": "same-site"})
        port = url.rpartition(":")[2]
        for foreign in ("http://127.0.0.1:1", f"http://localhost:{port}", "null", f"https://evil.example:{port}"):
            assert "not of this console" in await refused({"origin": foreign})
        assert "not of this console" in await refused({"referer": "http://127.0.0.1:1/attack.html"})
        assert "no Origin or Referer" in await refused({})
        # the cookie's own value, or another browser's token, is no token (same origin or not)
        assert "security token" in await refused({"origin": own}, {"csrf_token": client.cookies["kenning_csrf"]})
        async with httpx.AsyncClient(base_url=url, timeout=10) as other:
            theirs = await csrf_token(other)
        assert theirs != token
        assert "security token" in await refused({"origin": own}, {"csrf_token": theirs})
        # a planted cookie, with the value it holds as the token: refused
        client.cookies.set("kenning_csrf", PLANTED)
        assert "security token" in await refused({"origin": own}, {"csrf_token": PLANTED})
        assert not _cancel_requested(sql, "target-2")

        # from the console's page: Origin, Referer (no Origin), Sec-Fetch-Site same-origin or none
        for headers in ({"referer": f"{url}/instances/target-2/cancel"}, {"origin": own, "sec-fetch-site": "none"}):
            sql.execute("UPDATE kenning_instances SET cancel_requested = false WHERE id = 'target-2'")
            answer = await client.post(cancel, data={"csrf_token": await csrf_token(client)}, headers=headers)
            assert answer.status_code == 303, (headers, answer.text)
            assert _cancel_requested(sql, "target-2")
        sql.execute("UPDATE kenning_instances SET cancel_requested = false, status = 'waiting_for_event'")
        assert (await post_form(client, cancel, {})).status_code == 303
        assert _cancel_requested(sql, "target-2")
        page = await client.get("/instances/target-2")
        assert page.headers["referrer-policy"] == "same-origin"  # so the browser's Origin is not "null"


async def test_a_logged_in_browser_needs_its_session_token_and_a_script_its_bearer_token(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    expect_log("console.cross_origin_refused")
    token = "console-csrf-test-token-0123456789"
    _waiting_instance(sql, "target-3")
    url, console = spawn_console(processes, database_url, token=token)
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=10) as attacker:
        # a server of the same host gets a cookie and its token from the public login page...
        minted = await csrf_token(attacker)
        planted = attacker.cookies["kenning_csrf"]
    async with httpx.AsyncClient(base_url=url, timeout=10) as browser:
        login = await post_form(browser, "/login", {"token": token, "next": "/instances"})
        assert login.status_code == 303 and "kenning_session" in browser.cookies
        # ...and plants that cookie in a logged-in browser: the pair was made for no session
        browser.cookies.set("kenning_csrf", planted)
        answer = await browser.post(
            "/instances/target-3/cancel", data={"csrf_token": minted}, headers={"origin": own_origin(browser)}
        )
        assert answer.status_code == 403 and not _cancel_requested(sql, "target-3")
        assert (await post_form(browser, "/instances/target-3/cancel", {})).status_code == 303
    assert _cancel_requested(sql, "target-3")
    sql.execute("UPDATE kenning_instances SET cancel_requested = false, status = 'waiting_for_event'")
    async with httpx.AsyncClient(base_url=url, timeout=10) as script:  # no Origin, no form token: a bearer
        answer = await script.post("/instances/target-3/cancel", headers={"authorization": f"Bearer {token}"})
        assert answer.status_code == 303
        wrong = await script.post("/instances/target-3/cancel", headers={"authorization": "Bearer wrong"})
        assert wrong.status_code == 401
    assert _cancel_requested(sql, "target-3")
