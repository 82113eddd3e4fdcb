"""Durable streams on the console's instance page (issue 34, item 1), in a real browser
(Debian's Chromium driven by Playwright) against a real ``kenning console`` and
``kenning worker``: a page opened before the instance began its stream lists the stream
once it begins (the live refresh) and shows each entry as it is written, then the
close at the instance's end; the console's ``/stream`` endpoint is the ingress's event
format, resumable from ``Last-Event-ID``.

Before the feature the page had no streams: the test failed waiting for one."""

from __future__ import annotations

import os

import httpx
import psycopg
import pytest
from playwright.async_api import async_playwright

from kenning.client import Client
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.streams"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


async def test_a_stream_shows_live_on_the_instance_page(processes: ProcessPool, database_url: str, sql: Sql) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    count = 4
    async with Client(database_url) as client:
        await client.start("ticker", instance_id="ticking", count=count)
        await console_ready(url, console)
        await became(sql, "ticking", "waiting_for_message")

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 800})
                await page.goto(f"{url}/instances/ticking")
                assert await page.locator("[data-streams]").is_hidden()  # nothing written yet
                entries = page.locator("[data-stream='ticks'] [data-stream-entries] li")
                for n in range(count):
                    await client.send_message("ticking", "tick")
                    await entries.nth(n).wait_for(timeout=15_000)  # shown as written, no reload
                    assert await entries.nth(n).inner_text() == str(n)
                state = page.locator("[data-stream='ticks'] [data-stream-state]")
                await page.wait_for_function(
                    "el => el.textContent.startsWith('closed')", arg=await state.element_handle(), timeout=15_000
                )
                assert await state.inner_text() == f"closed, {count} entries"
                assert await entries.count() == count
            finally:
                await browser.close()

    # the endpoint itself: the ingress's events, resumed after Last-Event-ID
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get(
            "/stream", params={"instance": "ticking", "key": "ticks"}, headers={"last-event-id": "1"}
        )
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        ids = [line.removeprefix("id: ") for line in response.text.splitlines() if line.startswith("id: ")]
        assert ids == ["2", "3"] and response.text.endswith("event: close\ndata: {}\n\n")
        assert (await http.get("/stream", params={"instance": "nobody", "key": "ticks"})).status_code == 404
        assert (await http.get("/stream", params={"instance": "ticking", "key": ""})).status_code == 400
