"""The console's escape hatches and Actions page over HTTP, against a real console, worker
and PostgreSQL: terminate asks for its reason (422 without one) and is refused with the
command's reason once the instance ended (409); a skip on an instance with no compensation
to skip, and a retry of a saga that compensated, are refused on their pages before anything
is asked and when posted anyway, each refusal recorded in the action log as the CLI records
its own; the Actions page filters by kind and refuses a page position it did not make."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import httpx
import psycopg

from kenning.client import Client
from tests.console_support import action_lines, became, console_ready, instance_status, post_form, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, kenning_command

APP = "tests.apps.console_day"

Sql = psycopg.Connection[tuple[object, ...]]


def _recorded(url: str, target: str) -> list[dict[str, Any]]:
    listed = kenning_command("actions", "list", "--json", "--target", target, url=url)
    assert listed.returncode == 0, listed.stderr
    return list(reversed(json.loads(listed.stdout)))  # oldest first


async def test_terminate_skip_and_retry_refuse_with_the_commands_reasons(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    expect_log("instance.failed", workflow="day.compensated")  # the card is declined on purpose
    url, console = spawn_console(processes, database_url, app=APP, env={"KENNING_CONSOLE_PAGE_SIZE": "3"})
    processes.worker(database_url, APP)
    async with Client(database_url) as client:
        await client.start("day.order", instance_id="w-1", order_id="w-1")
        await client.start("day.compensated", instance_id="c-1", order_id="c-1")
    await console_ready(url, console)
    await became(sql, "w-1", "waiting_for_event")
    await became(sql, "c-1", "failed")

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        page = await http.get("/instances/w-1/terminate")
        assert page.status_code == 200 and "Terminate the instance" in page.text
        blank = await post_form(http, "/instances/w-1/terminate", {"reason": "  "})
        assert blank.status_code == 422 and "give a reason" in blank.text
        assert instance_status(sql, "w-1") == "waiting_for_event" and _recorded(database_url, "w-1") == []

        # nothing to skip: said on the page (no form), and refused when posted anyway
        skip_page = await http.get("/instances/w-1/skip-compensation")
        assert skip_page.status_code == 200 and "Skip the compensation" not in skip_page.text
        assert "only a saga that is compensating or failed at a compensation" in skip_page.text
        skipped = await post_form(http, "/instances/w-1/skip-compensation", {"reason": "r", "compensation": "x"})
        assert skipped.status_code == 409 and "only a saga that is compensating" in skipped.text

        # its compensations undid its steps: the retry page says so, and the retry refuses it
        retry_page = await http.get("/instances/c-1/retry")
        assert "1 compensation(s) already undid its steps" in retry_page.text
        assert "Retry the instance" not in retry_page.text
        retried = await post_form(http, "/instances/c-1/retry", {})
        assert retried.status_code == 409 and "already undid its steps" in retried.text
        assert instance_status(sql, "c-1") == "failed"

        ended = await post_form(http, "/instances/w-1/terminate", {"reason": "the customer left"})
        assert ended.status_code == 303 and ended.headers["location"] == "/instances/w-1"
        assert instance_status(sql, "w-1") == "failed"
        again = await post_form(http, "/instances/w-1/terminate", {"reason": "twice"})
        assert again.status_code == 409 and "it already ended failed" in again.text

        listed = await http.get("/actions", params={"kind": "terminate"})
        assert listed.status_code == 200 and listed.text.count('data-action="terminate"') == 2
        assert 'data-action="skip-compensation"' not in listed.text
        assert (await http.get("/actions", params={"before": "x"})).status_code == 400
        # 3 records a page (--console-page-size): the older link goes on after the last one shown
        newest = await http.get("/actions")
        assert newest.text.count("data-action-id=") == 3
        older = re.search(r'href="(/actions\?before=\d+)" rel="next"', newest.text)
        assert older is not None, newest.text
        rest = await http.get(html.unescape(older[1]))
        assert rest.text.count("data-action-id=") == 1 and 'rel="next"' not in rest.text
        assert 'data-action="retry"' in newest.text + rest.text

    # recorded as the CLI records its own: origin console, refused ones with 0 changed
    terminated = _recorded(database_url, "w-1")
    assert [(a["action"], a["origin"], a["affected"], a["reason"]) for a in terminated] == [
        ("skip-compensation", "console", 0, "r"),
        ("terminate", "console", 1, "the customer left"),
        ("terminate", "console", 0, "twice"),
    ]
    assert [(a["action"], a["affected"]) for a in _recorded(database_url, "c-1")] == [("retry", 0)]
    assert [line["done"] for line in action_lines(processes.log_of(console), "terminate")] == [True, False]
