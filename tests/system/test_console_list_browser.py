"""The instances list, dense, in a real browser (Debian's Chromium driven by Playwright)
against a real ``kenning console`` and ``kenning worker`` on a real PostgreSQL: its common
filters on one line (the others folded, open while in use), Ended and Duration columns,
ids on one line; at a phone's width nothing is wider than the screen."""

from __future__ import annotations

import os
import re

import psycopg
import pytest
from playwright.async_api import Page, async_playwright

from kenning.client import Client
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.console"
LONG_KEY = "import/" + "k" * 120  # a key far wider than its column

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


async def _filter_spread(page: Page) -> float:
    """How far apart (px) the tops of the visible filter controls are: a few px on one line
    (a select, an input and a button differ a little), a control's height and more on two."""
    tops: list[float] = await page.evaluate(
        """() => [...document.querySelectorAll('form.filters-line :is(input, select, button)')]
              .filter(el => el.checkVisibility())
              .map(el => Math.round(el.getBoundingClientRect().top))"""
    )
    assert len(tops) >= 5, tops  # status, workflow, id, search, Filter
    return max(tops) - min(tops)


async def test_the_instances_list_is_dense(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str
) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        done = (await client.start("shop.weigh", idempotency_key=LONG_KEY, parcel="p-1")).instance_id
        waiting = (await client.start("shop.order", order_id="o-1")).instance_id
    await console_ready(url, console)
    await became(sql, done, "completed")
    await became(sql, waiting, "waiting_for_event")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/instances")
            assert await _filter_spread(page) <= 8  # one line: status, workflow, id, search, Filter
            assert not await page.get_by_label("Created from").is_visible()
            headers = await page.locator("table.instances thead th").all_inner_texts()
            assert [h.upper() for h in headers[3:6]] == ["CREATED (UTC)", "ENDED", "DURATION"]

            finished = page.locator("tr", has=page.get_by_role("link", name=done, exact=True))
            assert re.fullmatch(r"\d\d:\d\d:\d\d", await finished.locator('[data-label="Ended"]').inner_text())
            took = await finished.locator('[data-label="Duration"]').inner_text()
            assert re.fullmatch(r"\d+ ms|\d+\.\d s", took), took
            running = page.locator("tr", has=page.get_by_role("link", name=waiting, exact=True))
            assert await running.locator('[data-label="Ended"]').inner_text() == "–"
            assert await running.locator('[data-label="Duration"]').inner_text() == ""
            # each id on one line, and the long key cut rather than widening the table
            lines = await page.evaluate(
                "() => [...document.querySelectorAll('table.instances td.id a')].map(a => a.getClientRects().length)"
            )
            assert lines and set(lines) == {1}, lines
            key = finished.locator('[data-label="Key"] [title]')
            assert await key.get_attribute("title") == LONG_KEY
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, f"the list is {width} px wide at 1280 px"

            # a folded filter in use opens the fold
            await page.goto(f"{url}/instances?key=import")
            assert await page.get_by_label("Idempotency key starts with").is_visible()
            assert done in await page.locator("table.instances").inner_text()

            phone = await browser.new_page(viewport={"width": 390, "height": 844})
            await phone.goto(f"{url}/instances")
            width = await phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the list is {width} px wide at a phone's 390 px"
        finally:
            await browser.close()
