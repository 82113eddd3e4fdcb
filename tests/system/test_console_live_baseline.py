"""The instance page's live stream starts from what the page shows, not from what it first
reads: after the console's own Cancel the page rendered the instance still waiting, the
instance finished before the browser opened the stream, and the stream (its baseline
already the final state) never said it changed. Here the finish between rendering and
connecting is made certain: no worker runs while the page renders, and the browser's
``/live/`` request is held until the instance has finished.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import psycopg
import pytest
from playwright.async_api import Route, async_playwright

from kenning.client import Client
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool, workers_started

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.console"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


async def test_the_page_shows_a_cancel_that_finished_before_its_stream_opened(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str
) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    worker = processes.worker(database_url, APP)
    async with Client(database_url) as client:
        instance_id = (await client.start("shop.order", order_id="o-live", quantity=1)).instance_id
    await console_ready(url, console)
    await became(sql, instance_id, "waiting_for_event")
    worker.terminate()  # the cancel's compensation waits for the next worker
    worker.wait(timeout=20)

    opened = asyncio.Event()

    async def hold_stream(route: Route) -> None:
        await opened.wait()
        await route.continue_()

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.route("**/live/**", hold_stream)
            await page.goto(f"{url}/instances/{instance_id}")
            await page.get_by_role("link", name="Cancel…").click()
            await page.get_by_role("button", name="Cancel the instance").click()
            await page.wait_for_url(f"{url}/instances/{instance_id}")
            assert await page.locator("[data-status]").inner_text() == "pending"  # runnable: compensations to run

            # the instance finishes while the page's stream is still being opened
            again = processes.worker(database_url, APP)
            await workers_started(processes, [again])
            await became(sql, instance_id, "cancelled")
            opened.set()

            # generous, yet well under a page reload's worth of patience; before the fix
            # it stayed "pending" for as long as anyone watched
            await page.wait_for_function(
                "() => document.querySelector('[data-status]').textContent === 'cancelled'", timeout=5_000
            )
        finally:
            await browser.close()


async def test_a_stream_with_a_malformed_version_is_refused(processes: ProcessPool, database_url: str) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    await console_ready(url, console)
    async with Client(database_url) as client:
        instance_id = (await client.start("shop.order", order_id="o-v")).instance_id
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.get(f"/live/{instance_id}?seen=not-a-version")
    assert response.status_code == 400
    assert "is not a page version (16 hex digits)" in response.text
