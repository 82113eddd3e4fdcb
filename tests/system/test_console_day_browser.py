"""An operator's day in the console (issue 37, item 4), in a real browser (Debian's Chromium
driven by Playwright) against a real ``kenning console``, ``kenning worker`` and the real
``kenning`` command: a waiting instance's page names the event or the message topic it waits
for; parent and child link to each other; a terminate and a skipped compensation from the
instance's page, each asking for its reason; the Actions page lists them beside the CLI's
cancels; a cancel from the CLI removes the Cancel button of the page watching it, without a
reload; a saga that compensated is not offered a retry; a queued instance held by its key's
rate limit says so and until when.

Before the change the page had no Terminate or Skip, /actions was 404, the Cancel button
stayed on a cancelled instance (the actions sat outside the live region), and Retry… was
offered on the compensated instance, then refused."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import psycopg
import pytest
from playwright.async_api import Page, async_playwright

from kenning.client import Client
from tests.apps import console_day
from tests.console_support import became, console_ready, instance_status, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, eventually, executions, kenning_command

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.console_day"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


def _actions(url: str) -> list[dict[str, Any]]:
    listed = kenning_command("actions", "list", "--json", url=url)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


async def _shoot(page: Page, name: str) -> None:
    """A screenshot into KENNING_SCREENSHOTS_DIR when it is set (docs/console.md's), else none."""
    folder = os.environ.get("KENNING_SCREENSHOTS_DIR")
    if folder:
        await page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


async def _links(page: Page, name: str) -> int:
    return await page.locator("[data-instance-actions]").get_by_role("link", name=name, exact=True).count()


async def test_an_operators_day(processes: ProcessPool, database_url: str, sql: Sql, side_channel: str) -> None:
    expect_log("instance.failed", workflow="day.compensated")  # the card is declined on purpose
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        await client.start("day.parent", instance_id="p-1", order_id="o-9")
        await client.start("day.order", instance_id="o-1", order_id="o-1")
        await client.start("day.order", instance_id="o-2", order_id="o-2")
        await client.start("day.stuck_saga", instance_id="s-1", order_id="o-3")
        await client.start("day.compensated", instance_id="c-1", order_id="o-4")
        # by the workflow itself: a start by name alone would not know its queue
        await client.start(console_day.hourly, instance_id="h-1", account="acme", n=1)
        await client.start(console_day.hourly, instance_id="h-2", account="acme", n=2)
    await console_ready(url, console)
    for instance_id, status in [
        ("p-1", "waiting_for_event"),
        ("p-1-approval", "waiting_for_message"),
        ("o-1", "waiting_for_event"),
        ("o-2", "waiting_for_event"),
        ("s-1", "waiting_for_event"),
        ("c-1", "failed"),
        ("h-1", "completed"),
    ]:
        await became(sql, instance_id, status)
    # the stuck saga cancelled from the CLI: its refund fails again and again
    cancelled = kenning_command("instances", "cancel", "s-1", url=database_url)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    await eventually(lambda: executions(side_channel)["refund s-1"] >= 2, timeout=20, message="the refund fails")
    assert instance_status(sql, "s-1") == "compensating"

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})

            # a waiting instance names what it waits for: the event, with its match
            await page.goto(f"{url}/instances/o-1")
            waits = await page.locator("[data-waits-for='event']").inner_text()
            assert "payment.received" in waits and '"order_id": "o-1"' in waits, waits
            assert "an event of type 'payment.received'" in await page.locator("[data-moves-on]").inner_text()

            # parent -> child -> parent: the parent waits for its child's end, the child for a message
            await page.goto(f"{url}/instances/p-1")
            await page.locator("[data-waits-for='child']").get_by_role("link", name="p-1-approval").click()
            await page.wait_for_url(f"{url}/instances/p-1-approval")
            topic = await page.locator("[data-waits-for='message']").inner_text()
            assert "a message on topic approval" in topic, topic
            # kenning why reads a parent waiting for its child too (its wait has no lower bound)
            why = kenning_command("why", "p-1", url=database_url)
            assert why.returncode == 0 and "'kenning.child.finished'" in why.stdout, why.stdout + why.stderr
            await page.locator("[data-parent]").get_by_role("link", name="p-1").click()
            await page.wait_for_url(f"{url}/instances/p-1")
            assert "p-1-approval" in await page.locator("[data-children]").inner_text()
            await _shoot(page, "instance-parent")

            # terminate from the instance's page: it asks for a reason, then ends it at once
            await page.goto(f"{url}/instances/o-1")
            await page.locator("[data-instance-actions]").get_by_role("link", name="Terminate…").click()
            await page.wait_for_url(f"{url}/instances/o-1/terminate")
            await page.get_by_label("Reason").fill("the customer left")
            await page.get_by_role("button", name="Terminate the instance").click()
            await page.wait_for_url(f"{url}/instances/o-1")
            assert await page.locator("[data-status]").inner_text() == "failed"
            for gone in ("Terminate…", "Cancel…", "Retry…"):  # ended, and a terminated one is not retried
                assert await _links(page, gone) == 0, gone
            assert instance_status(sql, "o-1") == "failed"

            # skip the failing refund: the saga goes on past it and ends cancelled
            await page.goto(f"{url}/instances/s-1")
            assert await _links(page, "Cancel…") == 0  # already being cancelled
            await page.locator("[data-instance-actions]").get_by_role("link", name="Skip a compensation…").click()
            await page.wait_for_url(f"{url}/instances/s-1/skip-compensation")
            assert await page.get_by_role("radio", name=re.compile("refund")).is_checked()  # the failing one
            await _shoot(page, "skip-compensation")
            await page.get_by_label("Reason").fill("refunded by hand")
            await page.get_by_role("button", name="Skip the compensation").click()
            await page.wait_for_url(f"{url}/instances/s-1")
            await page.wait_for_function(
                "() => document.querySelector('[data-status]').textContent === 'cancelled'", timeout=20_000
            )
            assert await _links(page, "Skip a compensation…") == 0
            assert executions(side_channel)["release s-1"] == 1

            # a saga whose compensations undid its steps: no Retry… to be refused, and why not
            await page.goto(f"{url}/instances/c-1")
            assert await page.locator("[data-status]").inner_text() == "failed"
            assert await _links(page, "Retry…") == 0
            assert "already undid its steps" in await page.locator("[data-retry-refused]").inner_text()

            # a queued instance held by its key's rate limit says so, and until when
            await eventually(
                lambda: (
                    sql.execute(
                        "SELECT available_at > now() + interval '1 minute' FROM kenning_instances WHERE id = 'h-2'"
                    ).fetchone()
                    == (True,)
                ),
                timeout=20,
                message="h-2 waits for its key's window",
            )
            await page.goto(f"{url}/instances/h-2")
            queue = await page.locator("[data-waits-for='queue']").inner_text()
            assert "day-hourly, key 'acme'" in queue and "held by key acme's rate limit until" in queue, queue
            assert "rate window frees" in await page.locator("[data-moves-on]").inner_text()
            await _shoot(page, "instance-rate-limited")

            # a cancel from the CLI: the page watching it drops its Cancel button, with no reload
            await page.goto(f"{url}/instances/o-2")
            assert await _links(page, "Cancel…") == 1
            await page.evaluate("window.kenningNotReloaded = true")
            cancel = kenning_command("instances", "cancel", "o-2", url=database_url)
            assert cancel.returncode == 0, cancel.stdout + cancel.stderr
            await page.wait_for_function(
                "() => document.querySelector('[data-status]').textContent === 'cancelled'", timeout=20_000
            )
            assert await _links(page, "Cancel…") == 0 and await _links(page, "Terminate…") == 0
            assert await page.evaluate("window.kenningNotReloaded === true")

            # the parent's page follows its child's end, a section the reader opened kept open
            await page.goto(f"{url}/instances/p-1")
            step = page.locator(".timeline details > summary", has_text="Details").first
            await step.click()
            sent = kenning_command("message", "send", "p-1-approval", "approval", "--data", '"yes"', url=database_url)
            assert sent.returncode == 0, sent.stdout + sent.stderr
            await page.wait_for_function(
                "() => document.querySelector('[data-status]').textContent === 'completed'", timeout=20_000
            )
            assert await page.locator("[data-waits-for]").count() == 0
            assert await page.locator(".timeline details[open] > summary", has_text="Details").count() == 1
            assert await _links(page, "Cancel…") == 0 and await _links(page, "Terminate…") == 0

            # the Actions page: the console's terminate and skip beside the CLI's cancels
            await page.get_by_role("navigation", name="Main").get_by_role("link", name="Actions").click()
            await page.wait_for_url(f"{url}/actions")
            log = page.locator("[data-action-log]")
            terminate = await log.locator("[data-action='terminate']").inner_text()
            assert "o-1" in terminate and "console" in terminate and "the customer left" in terminate, terminate
            skipped = await log.locator("[data-action='skip-compensation']").inner_text()
            assert "s-1" in skipped and "refunded by hand" in skipped and "refund" in skipped, skipped
            assert await log.locator("[data-action='cancel']").count() == 2  # s-1 and o-2, from the CLI
            await _shoot(page, "actions")
            await page.get_by_label("On (instance id, queue or schedule)").fill("o-1")
            await page.get_by_role("button", name="Filter").click()
            await page.wait_for_url(re.compile(r"/actions\?target=o-1"))
            assert await log.locator("tbody tr").count() == 1
            await log.get_by_role("link", name="o-1").click()
            await page.wait_for_url(f"{url}/instances/o-1")
        finally:
            await browser.close()

    # the console's actions are in the log the CLI reads, as the CLI's are
    recorded = {(a["action"], a["target"]): a for a in _actions(database_url)}
    assert recorded[("terminate", "o-1")]["origin"] == "console" and recorded[("terminate", "o-1")]["affected"] == 1
    assert recorded[("skip-compensation", "s-1")]["details"]["compensation"] == "refund"
    assert recorded[("cancel", "o-2")]["origin"] == "cli"
