"""The console's Workers page in a real browser (Debian's Chromium driven by Playwright),
against a real ``kenning console`` and ``kenning worker`` on a real PostgreSQL.

An operator follows the navigation's Workers link and sees the worker live with its
workflows and load, and the console itself; the worker is killed with ``kill -9`` and,
on a reload, shows as stale; the kind filter keeps the workers; a kind that does not
exist is a 400 page saying which kinds there are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest
from playwright.async_api import Page, async_playwright

from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool, eventually, workers_started

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
FAST = {"KENNING_PRESENCE_INTERVAL": "0.1"}  # stale 0.3 s after the last heartbeat

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


async def _until_shown(page: Page, selector: str, message: str) -> None:
    """Reload until ``selector`` is on the page, as an operator does."""

    async def shown() -> bool:
        if await page.locator(selector).count():
            return True
        await page.reload()
        return False

    await eventually(cast(Any, shown), timeout=20, interval=0.2, message=message)


async def test_the_workers_page_shows_live_and_stale_processes(
    processes: ProcessPool, database_url: str, tmp_path: Path
) -> None:
    url, console = spawn_console(processes, database_url, env=FAST)
    worker = processes.worker(database_url, "tests.apps.fleet", "--worker-id", "browser-worker", env=FAST)
    await console_ready(url, console)
    await workers_started(processes, [worker])
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/instances")
            await page.get_by_role("link", name="Workers").click()
            await page.wait_for_url(f"{url}/workers")
            assert await page.get_by_role("link", name="Workers").get_attribute("aria-current") == "page"
            row = '[data-process="browser-worker"][data-state="live"]'
            await _until_shown(page, row, "the worker listed live")
            worker_row = page.locator(row)
            assert await worker_row.locator('[data-label="Workflows"]').inner_text() == "fleet.double"
            assert await worker_row.locator('[data-label="Busy"]').inner_text() == "0 / 32"
            assert await worker_row.locator('[data-label="Kind"]').inner_text() == "worker"
            kind_console = page.locator('[data-label="Kind"]', has_text="console")
            consoles = page.locator('tr[data-state="live"]', has=kind_console)
            assert await consoles.count() == 1  # the console registers itself
            await page.screenshot(path=str(tmp_path / "workers.png"), full_page=True)

            worker.kill()  # no goodbye: it stops heartbeating
            worker.wait(timeout=10)
            await _until_shown(page, '[data-process="browser-worker"][data-state="stale"]', "the worker stale")
            assert "1 stale" in await page.locator("[data-process-counts]").inner_text()

            await page.get_by_role("link", name="worker", exact=True).click()
            await page.wait_for_url(f"{url}/workers?kind=worker")
            kinds = await page.locator('tbody [data-label="Kind"]').all_inner_texts()
            assert kinds == ["worker"]

            response = await page.goto(f"{url}/workers?kind=robot")
            assert response is not None and response.status == 400
            assert "kind must be one of worker, scheduler, relayer, ingress, console" in await page.content()
        finally:
            await browser.close()
