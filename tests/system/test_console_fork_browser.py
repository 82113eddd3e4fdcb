"""The console's fork button (issue 37, item 2) in a real browser against a real console and
worker processes: a saga failed at step 3 on the old code; after a worker with the fix
starts, the original's page offers "Fork…", whose form lists the history by number; an
input the workflow refuses comes back in the form and makes nothing; step 3 makes a fork
that runs only step 3, and each page links to the other. The action log has it once, from
the console."""

from __future__ import annotations

import json
import os

import psycopg
import pytest
from playwright.async_api import async_playwright

from kenning import Client
from tests.apps import forks
from tests.console_support import became, console_ready, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, executions, kenning_command, workers_started

Sql = psycopg.Connection[tuple[object, ...]]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
APP = "tests.apps.forks"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
)


def _forks_of(sql: Sql, instance_id: str) -> list[str]:
    rows = sql.execute("SELECT id FROM kenning_instances WHERE forked_from = %s", (instance_id,)).fetchall()
    return [str(r[0]) for r in rows]


async def test_the_fork_button_forks_a_failed_saga_from_the_step_chosen(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="forks.saga")
    url, console = spawn_console(processes, database_url, app=APP)  # --app: the input is checked
    old = processes.worker(database_url, APP)
    async with Client(database_url) as client:
        original = (await client.start(forks.saga, order="o-9", amount=12)).instance_id
    await became(sql, original, "failed")
    old.terminate()
    old.wait(timeout=20)
    new = processes.worker(database_url, APP, env={forks.FIXED: "1"})  # the deploy with the fix
    await console_ready(url, console)
    await workers_started(processes, [new])

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/instances/{original}")
            await page.get_by_role("link", name="Fork…").click()
            await page.get_by_role("heading", name="Fork this instance?").wait_for()
            step = page.get_by_label("Run again from step")
            offered = await step.locator("option").all_inner_texts()
            # the workflow body's steps by number; the compensations' records are not offered
            assert [o.split(" · ")[:2] for o in offered] == [["1", "reserve:1"], ["2", "charge:1"], ["3", "ship:1"]]
            await step.select_option("3")
            await page.get_by_label("Input (optional").fill('{"order": "o-9"}')  # no amount
            await page.get_by_role("button", name="Fork the instance").click()
            error = page.locator("[data-fork-error]")
            await error.wait_for()
            assert "invalid input for workflow 'forks.saga'" in await error.inner_text()
            assert _forks_of(sql, original) == []  # nothing made

            await page.get_by_label("Input (optional").fill("")
            await step.select_option("3")
            await page.get_by_role("button", name="Fork the instance").click()
            forked_from = page.locator("[data-forked-from]")
            await forked_from.wait_for()
            (fork_id,) = _forks_of(sql, original)
            assert page.url.endswith(f"/instances/{fork_id}")
            assert await forked_from.inner_text() == f"Forked from {original} at step 3"
            await became(sql, fork_id, "completed")

            await page.get_by_role("link", name=original).click()
            forked_to = page.locator("[data-forked-to]")
            await forked_to.wait_for()
            assert (await forked_to.inner_text()).startswith(f"Forked to {fork_id} at step 3")
        finally:
            await browser.close()

    ran = executions(side_channel)
    assert ran[f"reserve {fork_id}"] == 0 and ran[f"charge {fork_id} 12"] == 0 and ran[f"ship {fork_id}"] == 1
    logged = kenning_command("actions", "list", "--target", original, "--json", url=database_url)
    assert logged.returncode == 0, logged.stderr
    entries = [e for e in json.loads(logged.stdout) if e["action"] == "fork"]
    assert len(entries) == 1 and entries[0]["origin"] == "console", entries
    assert entries[0]["details"]["fork_id"] == fork_id
