"""Bulk actions from the console's filtered list (issue 28, item 3), in a real browser
against a real console and worker: the list filtered by workflow and status offers only
the actions that apply; the confirmation shows the count before anything changes; the
action changes exactly what the filter selected and is recorded once in the operator
action log, from the console."""

from __future__ import annotations

import json
import os

import psycopg
import pytest
from playwright.async_api import async_playwright

from kenning.client import Client
from tests.console_support import became, console_ready, spawn_console
from tests.support import ProcessPool, kenning_command

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.console"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


async def test_cancel_all_matching_asks_with_the_count_then_cancels_them(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        waiting = [(await client.start("shop.order", order_id=f"o-{n}")).instance_id for n in range(3)]
        other = (await client.start("shop.weigh", parcel="p-1")).instance_id
    await console_ready(url, console)
    for instance_id in waiting:
        await became(sql, instance_id, "waiting_for_event")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/instances")
            # the unfiltered list offers no bulk action: it would name nothing in particular
            assert await page.get_by_role("link", name="Cancel all…").count() == 0
            await page.goto(f"{url}/instances?workflow=shop.order&status=waiting_for_event")
            assert await page.get_by_role("link", name="Retry all…").count() == 0  # retry applies to failed only
            await page.get_by_role("link", name="Cancel all…").click()
            assert await page.locator("[data-bulk-count]").inner_text() == "3"
            assert sql.execute("SELECT count(*) FROM kenning_instances WHERE cancel_requested").fetchone() == (0,)
            await page.get_by_role("button", name="Cancel 3 instance(s)").click()
            await page.get_by_text("3 of 3 instance(s) changed").wait_for()
        finally:
            await browser.close()
    for instance_id in waiting:
        await became(sql, instance_id, "cancelled")
    assert sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (other,)).fetchone() != ("cancelled",)
    logged = kenning_command("actions", "list", "--json", url=database_url)
    assert logged.returncode == 0, logged.stderr
    entries = [e for e in json.loads(logged.stdout) if e["action"] == "cancel" and e["origin"] == "console"]
    assert len(entries) == 1 and entries[0]["affected"] == 3, entries
    assert entries[0]["filter"]["workflow"] == "shop.order", entries
