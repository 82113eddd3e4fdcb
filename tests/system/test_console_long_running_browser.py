"""Issue 29's console parts in a real browser (Debian's Chromium driven by Playwright)
against a real ``kenning console`` and ``kenning worker`` on a real PostgreSQL: an
instance answered two requests, each in its own run of a ``continue_as_new`` chain, and
published its owner (a search attribute) and a status. Its page shows the run, the chain
and the published values; the list finds it by its search attribute typed into the
folded filter, and shows its status text; neither page is wider than a phone."""

from __future__ import annotations

import os

import psycopg
import pytest
from playwright.async_api import async_playwright

from kenning.client import Client
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool, eventually

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.contract"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


def _run_of(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT run FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
    return None if row is None else row[0]


async def test_the_chain_the_values_and_the_search_in_a_browser(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        await client.start("contract.entity", instance_id="entity-ann", owner="ann")
        await client.start("contract.entity", instance_id="entity-bob", owner="bob")
        for run in (1, 2):
            reply = await client.request("entity-ann", "bump", None, request_id=f"b{run}", timeout=20)
            assert reply == {"run": run, "bumps": run}
    await console_ready(url, console)
    await became(sql, "entity-ann", "waiting_for_message")
    await eventually(lambda: _run_of(sql, "entity-ann") == 3, timeout=20, message="entity-ann in run 3")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/instances/entity-ann")
            assert (await page.locator("[data-run]").inner_text()).startswith("3")
            runs = page.locator("table[data-runs] tr[data-run-row]")
            rows = [await runs.nth(i).inner_text() for i in range(await runs.count())]
            assert len(rows) == 3, rows  # runs 1 and 2 ended, 3 waits
            assert sum("continued" in row for row in rows) == 2, rows
            values = await page.locator("table[data-published]").inner_text()
            assert "owner" in values and "ann" in values and "run 3" in values, values

            await page.goto(f"{url}/instances")
            await page.locator("details.more-filters summary").click()
            await page.get_by_label("Search attributes").fill("owner=ann")
            await page.get_by_role("button", name="Filter").click()
            await page.wait_for_url("**/instances?*where=owner*")
            listed = await page.locator("table.instances").inner_text()
            assert "entity-ann" in listed and "entity-bob" not in listed, listed
            row = page.locator("tr", has=page.get_by_role("link", name="entity-ann", exact=True))
            assert await row.locator("[data-status-text]").inner_text() == "run 3 (100%)"  # its progress, 3 / 3

            phone = await browser.new_page(viewport={"width": 390, "height": 844})
            for path in ("/instances/entity-ann", "/instances?where=owner%3Dann"):
                await phone.goto(f"{url}{path}")
                width = await phone.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, f"{path} is {width} px wide at a phone's 390 px"
        finally:
            await browser.close()
