"""The console's Schedules and Queues pages in a real browser (Debian's Chromium driven by
Playwright), against a real ``kenning console`` and ``kenning scheduler`` on a real
PostgreSQL: an operator pauses a schedule with a reason, resumes it, triggers a run and
follows its link; pauses and resumes a queue; each action lands in the database."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest
from playwright.async_api import Page, async_playwright

from tests.console_support import action_lines, console_ready, spawn_console
from tests.scheduler_support import Sql, spawn_scheduler
from tests.support import ProcessPool, eventually

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

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


def _paused(sql: Sql, table: str, key: str, name: str) -> tuple[Any, ...] | None:
    return sql.execute(f"SELECT paused FROM {table} WHERE {key} = %s", (name,)).fetchone()


async def test_schedules_and_queues_pages_pause_resume_and_trigger(
    processes: ProcessPool, database_url: str, sql: Sql, tmp_path: Path
) -> None:
    sql.execute(
        "INSERT INTO kenning_queues (name, concurrency, rate_limit, rate_period_seconds) VALUES ('mail', 3, 10, 60)"
    )
    url, console = spawn_console(processes, database_url)
    spawn_scheduler(processes, database_url, "--app", "tests.apps.schedules")
    await console_ready(url, console)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/instances")
            await page.get_by_role("link", name="Schedules").click()
            await page.wait_for_url(f"{url}/schedules")
            assert await page.get_by_role("link", name="Schedules").get_attribute("aria-current") == "page"
            await _until_shown(page, '[data-schedule="quarter_hourly"]', "the schedules declared")
            row = page.locator('[data-schedule="quarter_hourly"]')
            assert await row.locator('[data-label="Expression"]').inner_text() == "*/15 * * * *"
            assert (
                await page.locator('[data-schedule="held_buffer"] [data-label="Overlap"]').inner_text() == "buffer_one"
            )
            assert "UTC" in await row.locator('[data-label="Next tick"]').inner_text()

            await page.get_by_label("Reason to pause quarter_hourly").fill("month-end freeze")
            await page.get_by_role("button", name="Pause quarter_hourly").click()
            await page.wait_for_url(f"{url}/schedules?done=paused&name=quarter_hourly")
            assert await page.get_by_role("status").inner_text() == "quarter_hourly: paused"
            paused_row = page.locator('[data-schedule="quarter_hourly"][data-paused="yes"]')
            assert "month-end freeze" in await paused_row.locator('[data-label="State"]').inner_text()
            assert await paused_row.locator('[data-label="Next tick"]').inner_text() == "–"
            assert _paused(sql, "kenning_schedules", "workflow_name", "quarter_hourly") == (True,)
            await page.screenshot(path=str(tmp_path / "schedules.png"), full_page=True)

            await page.get_by_role("button", name="Resume quarter_hourly").click()
            await page.wait_for_url(f"{url}/schedules?done=resumed&name=quarter_hourly")
            assert await page.locator('[data-schedule="quarter_hourly"]').get_attribute("data-paused") == "no"
            assert _paused(sql, "kenning_schedules", "workflow_name", "quarter_hourly") == (False,)

            await page.get_by_role("button", name="Trigger quarter_hourly").click()
            await page.wait_for_url(f"{url}/schedules?done=triggered*")
            link = page.get_by_role("status").get_by_role("link")
            triggered = await link.inner_text()
            assert triggered.startswith("quarter_hourly@") and triggered.endswith("Z-trigger"), triggered
            assert sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (triggered,)).fetchone() == (
                "pending",
            )
            last = page.locator('[data-schedule="quarter_hourly"] [data-label="Last instance"]')
            assert triggered in await last.inner_text()
            await link.click()
            await page.wait_for_url(f"{url}/instances/**")

            await page.get_by_role("link", name="Queues").click()
            await page.wait_for_url(f"{url}/queues")
            mail = page.locator('[data-queue="mail"]')
            assert await mail.locator('[data-label="Limits"]').inner_text() == "concurrency 3, rate 10 / 60 s"
            assert await mail.locator('[data-label="Depth"]').inner_text() == "0"
            await page.get_by_role("button", name="Pause mail").click()
            await page.wait_for_url(f"{url}/queues?done=paused&name=mail")
            assert await page.locator('[data-queue="mail"]').get_attribute("data-paused") == "yes"
            assert _paused(sql, "kenning_queues", "name", "mail") == (True,)
            await page.get_by_role("button", name="Resume mail").click()
            await page.wait_for_url(f"{url}/queues?done=resumed&name=mail")
            assert _paused(sql, "kenning_queues", "name", "mail") == (False,)
        finally:
            await browser.close()
    log = processes.log_of(console)
    for action in ("schedule.pause", "schedule.resume", "schedule.trigger", "queue.pause", "queue.resume"):
        assert len(action_lines(log, action)) == 1, action
    assert action_lines(log, "schedule.pause")[0]["reason"] == "month-end freeze"
