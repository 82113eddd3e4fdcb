"""The console in a real browser: Debian's headless Chromium driven by Playwright, against a
real ``kenning console`` and ``kenning worker`` on a real PostgreSQL.

One walk through what an operator does: list, filter, open an instance, cancel it (by
keyboard) and see its compensation run; start a workflow from the form with bad input
(the error in the form), then good; send an event that a handler refuses, see it parked
with its reason, fix the cause and retry it until it is delivered. Every form control
on the pages it visits has a label.

Screenshots of the main pages (desktop, and the list and an instance at a phone's
width) are taken on the way: into the test's temporary folder, or into
``KENNING_SCREENSHOTS_DIR`` when set (``docs/console/`` holds the committed ones:
``KENNING_SCREENSHOTS_DIR=docs/console pytest tests/system/test_console_browser.py``), so CI
never writes into the tree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from playwright.async_api import Browser, Page, ViewportSize, async_playwright

from kenning.client import Client
from kenning.db import Database
from kenning.storage.inbox import NewEvent, inbox_insert_events
from tests.console_support import action_lines, became, console_ready, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, eventually, executions

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
APP = "tests.apps.console"
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the screenshots go: KENNING_SCREENSHOTS_DIR if set, else the test's tmp folder."""
    folder = Path(os.environ.get("KENNING_SCREENSHOTS_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def _until_shown(page: Page, predicate: Callable[[], Awaitable[bool]], message: str) -> None:
    """Reload the page until ``predicate`` holds: what an operator does, whatever the live updates do."""

    async def shown() -> bool:
        if await predicate():
            return True
        await page.reload()
        return False

    # (eventually's Awaitable[T] | T signature leaves mypy no T for a coroutine function)
    await eventually(cast(Any, shown), timeout=20, interval=0.2, message=message)


async def _unlabelled(page: Page) -> list[str]:
    """Visible form controls without a label (or aria-label): none is allowed."""
    found: list[str] = await page.evaluate(
        """() => [...document.querySelectorAll('input, select, textarea')]
              .filter(el => el.type !== 'hidden' && !el.hidden)
              .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
              .map(el => el.name || el.id || el.outerHTML)"""
    )
    return found


async def _shoot(page: Page, folder: Path, name: str) -> None:
    await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


async def _phone_shots(browser: Browser, url: str, instance_id: str, folder: Path) -> None:
    phone = await browser.new_page(viewport=PHONE, device_scale_factor=1)
    await phone.goto(f"{url}/instances")
    # nothing wider than the screen: tables become cards, forms stack
    width = await phone.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the list is {width} px wide at a phone's {PHONE['width']} px"
    await _shoot(phone, folder, "instances-phone")
    await phone.goto(f"{url}/instances/{instance_id}")
    await _shoot(phone, folder, "instance-phone")
    await phone.close()


async def _refresh_keeps_the_focus(page: Page, sql: Sql, focused_id: str) -> None:
    """The list's auto-refresh swaps only what changed, and keeps a keyboard user's focus
    where it was; its button pauses it (aria-pressed says so)."""
    toggle = page.locator("[data-refresh-toggle]")
    await toggle.click()
    assert await toggle.get_attribute("aria-pressed") == "true"
    await toggle.click()
    assert await toggle.get_attribute("aria-pressed") == "false"
    link = page.get_by_role("link", name=focused_id, exact=True)
    await link.focus()
    focused = "document.activeElement.getAttribute('href')"
    await page.wait_for_timeout(800)  # a refresh or more, nothing changed: nothing swapped, nothing announced
    assert await page.evaluate(focused) == f"/instances/{focused_id}"
    assert not (await page.locator("[data-live-state]").inner_text()).startswith("Updated")
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, created_at, updated_at) "
        "VALUES ('focus-check', 'seed.row', 'completed', '{}', now(), now())"
    )
    await page.wait_for_function(
        "() => document.querySelector('[data-live-region]').textContent.includes('focus-check')"
    )
    assert await page.evaluate(focused) == f"/instances/{focused_id}"  # the same link, in the fresh table
    assert (await page.locator("[data-live-state]").inner_text()).startswith("Updated")


async def test_an_operator_walks_through_the_console(
    processes: ProcessPool,
    database: Database,
    database_url: str,
    sql: Sql,
    side_channel: str,
    blocker: Path,
    screenshots: Path,
) -> None:
    expect_log("instance.failed", workflow="shop.fulfil")
    expect_log("inbox.failed", event_type="audit.recorded")
    blocker.touch()
    # a short auto-refresh, so the list's live updates run while the test watches
    url, console = spawn_console(processes, database_url, app=APP, env={"KENNING_CONSOLE_REFRESH_INTERVAL": "0.5"})
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        first = (await client.start("shop.order", order_id="o-1", quantity=2)).instance_id
        paid = (await client.start("shop.order", order_id="o-2")).instance_id
        failing = (await client.start("shop.fulfil", order_id="o-3")).instance_id
    await console_ready(url, console)
    await became(sql, failing, "failed")
    await became(sql, paid, "waiting_for_event")
    async with database.connection() as conn:
        payment = NewEvent("/pay", "pay-o-2", "payment.received", {"specversion": "1.0"}, {"order_id": "o-2"})
        await inbox_insert_events(conn, [payment])
    await became(sql, paid, "completed")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport=DESKTOP, device_scale_factor=1)

            # list -> filter -> open
            await page.goto(f"{url}/instances")
            assert failing in await page.inner_text("main")
            await _shoot(page, screenshots, "instances")
            await _refresh_keeps_the_focus(page, sql, failing)
            await page.get_by_label("Workflow", exact=True).fill("shop.order")
            await page.get_by_role("button", name="Filter").click()
            await page.wait_for_url(re.compile(r"workflow=shop\.order"))
            listed = await page.inner_text("table")
            assert first in listed and paid in listed and failing not in listed
            await page.get_by_role("link", name=first).click()
            await page.wait_for_url(f"{url}/instances/{first}")

            # cancel, reached and confirmed with the keyboard, and see the compensation run
            for _ in range(20):
                await page.keyboard.press("Tab")
                if await page.evaluate("document.activeElement.textContent.trim()") == "Cancel…":
                    break
            else:
                raise AssertionError("Tab never reaches the instance's Cancel… link")
            await page.keyboard.press("Enter")
            await page.wait_for_url(f"{url}/instances/{first}/cancel")
            assert "Cancel this instance?" in await page.inner_text("h1")
            await page.get_by_role("button", name="Cancel the instance").focus()
            await page.keyboard.press("Enter")
            await page.wait_for_url(f"{url}/instances/{first}")

            async def compensated() -> bool:
                main = await page.inner_text("main")
                return "cancelled" in main and "release_stock" in main and "not run" not in main

            await _until_shown(page, compensated, "the instance page shows it cancelled and release_stock run")
            assert executions(side_channel)[f"release {first} res-o-1"] == 1
            await _shoot(page, screenshots, "instance")

            # start from the form: bad input, the error in the form; then good input
            await page.goto(f"{url}/start?workflow=shop.order")
            assert await _unlabelled(page) == []
            await page.get_by_label("Input").fill('{"order_id": "o-4", "quantity": "a few"}')
            async with page.expect_response(f"{url}/start") as bad:
                await page.get_by_role("button", name="Check the input").click()
            assert (await bad.value).status == 422
            alert = await page.get_by_role("alert").inner_text()
            assert "quantity" in alert and "integer" in alert
            assert await page.get_by_label("Input").get_attribute("aria-invalid") == "true"
            await _shoot(page, screenshots, "start-error")
            await page.get_by_label("Input").fill('{"order_id": "o-4", "quantity": 3}')
            await page.get_by_role("button", name="Check the input").click()
            assert "Start this workflow?" in await page.inner_text("h1")
            await page.get_by_role("button", name="Start it").click()
            await page.wait_for_url(re.compile(rf"{re.escape(url)}/instances/shop\.order-"))
            started = page.url.rsplit("/", 1)[1]
            await became(sql, started, "waiting_for_event")

            # an event the handler refuses: parked with its reason, then retried once the cause is gone
            await page.goto(f"{url}/events/send")
            assert await _unlabelled(page) == []
            await page.get_by_label("Type").fill("audit.recorded")
            await page.get_by_label("Id").fill("audit-1")
            await page.get_by_label("Data").fill('{"who": "ops"}')
            await page.get_by_role("button", name="Check the event").click()
            await page.get_by_role("button", name="Send it").click()
            await page.wait_for_url(re.compile(r"/events/inbox\?sent=1"))
            assert "event stored in the inbox" in await page.get_by_role("status").inner_text()
            await page.goto(f"{url}/events/inbox")
            inbox_id = sql.execute("SELECT id FROM kenning_inbox WHERE event_id = 'audit-1'").fetchone()
            assert inbox_id is not None
            row = page.locator(f"#inbox-{inbox_id[0]}")

            async def parked() -> bool:
                return "parked" in await row.inner_text() and "read-only" in await row.inner_text()

            await _until_shown(page, parked, "the inbox shows the event parked with its reason")
            assert await _unlabelled(page) == []
            await _shoot(page, screenshots, "inbox")
            blocker.unlink()
            await row.get_by_role("link", name=re.compile("Retry")).click()
            await page.get_by_role("button", name="Retry it").click()
            await page.goto(f"{url}/events/inbox")

            async def delivered() -> bool:
                return "delivered" in await page.locator(f"#inbox-{inbox_id[0]}").inner_text()

            await _until_shown(page, delivered, "the retried event is delivered")
            assert executions(side_channel)["audit audit-1"] == 2

            # live updates: the page of a waiting instance shows it cancelled elsewhere, unreloaded
            await page.goto(f"{url}/instances/{started}")
            await page.wait_for_function(
                "() => document.querySelector('[data-live-state]').textContent.startsWith('Live')"
            )
            async with Client(database_url) as client:
                assert await client.cancel(started)
            await page.wait_for_function(
                "() => document.querySelector('[data-status]').textContent === 'cancelled'", timeout=20_000
            )

            # a dead letter as a relayer leaves one the broker refused (no relayer runs here)
            sql.execute(
                "UPDATE kenning_outbox SET status = 'failed', attempts = 1, last_attempt_at = now(), "
                "last_error = 'HTTP 400 from http://broker.example/events: unknown event type' "
                "WHERE instance_id = %s",
                [paid],
            )
            await page.goto(f"{url}/events/outbox")
            table = await page.inner_text("table")
            assert "stock.reserved" in table and "unknown event type" in table and "dead letter" in table
            await _shoot(page, screenshots, "outbox")
            await _phone_shots(browser, url, first, screenshots)
        finally:
            await browser.close()
    log = processes.log_of(console)
    assert [line["instance_id"] for line in action_lines(log, "cancel")] == [first]
    assert [line["instance_id"] for line in action_lines(log, "start")] == [started]
    assert [line["inbox_id"] for line in action_lines(log, "inbox_retry")] == [inbox_id[0]]
