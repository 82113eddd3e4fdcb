"""Schedule and queue actions land in the operator action log as the instance actions do,
from the CLI and from the console: ``kenning actions list --json`` shows who paused a
schedule (``kenning schedules pause``), triggered and backfilled it, and who paused a
queue (the console's Queues page), and a console pause of a schedule. Against a real
``kenning console`` and the real CLI on a real PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg

from kenning.db import Database
from kenning.storage.schedules import ScheduleDeclaration, schedules_declare
from tests.console_support import console_ready, post_form, spawn_console
from tests.support import ProcessPool, kenning_command

Sql = psycopg.Connection[tuple[object, ...]]


def _actions(url: str) -> list[dict[str, Any]]:
    listed = kenning_command("actions", "list", "--json", url=url)
    assert listed.returncode == 0, listed.stderr
    return list(reversed(json.loads(listed.stdout)))  # oldest first


def _cli(url: str, *args: str) -> str:
    done = kenning_command(*args, url=url)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_schedule_and_queue_actions_are_recorded_from_the_cli_and_the_console(
    processes: ProcessPool, database: Database, database_url: str, sql: Sql
) -> None:
    async with database.connection() as conn:
        await schedules_declare(conn, [ScheduleDeclaration("nightly", "0 3 * * *", "UTC", "skip")])
    sql.execute("INSERT INTO kenning_queues (name, concurrency) VALUES ('mail', 3)")
    url, console = spawn_console(processes, database_url)
    await console_ready(url, console)

    assert _cli(database_url, "schedules", "pause", "nightly", "--reason", "month-end freeze") == "nightly: paused"
    assert _cli(database_url, "schedules", "resume", "nightly") == "nightly: resumed"
    triggered = _cli(database_url, "schedules", "trigger", "nightly")
    span = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T23:59:00Z"]
    assert _cli(database_url, "schedules", "backfill", "nightly", *span, "--dry-run").startswith("nightly: 2 ticks")
    assert _cli(database_url, "schedules", "backfill", "nightly", *span) == "nightly: 2 started, 0 had run already"
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        paused = await post_form(client, "/queues/mail/pause", {})
        assert paused.status_code == 303, paused.text
        again = await post_form(client, "/schedules/nightly/pause", {"reason": "from the console"})
        assert again.status_code == 303, again.text
        missing = await post_form(client, "/queues/nobody/pause", {})
        assert missing.status_code == 404  # refused: nothing changed, nothing recorded

    actions = _actions(database_url)
    seen = [(a["action"], a["origin"], a["target"], a["affected"], a["reason"]) for a in actions]
    assert seen == [
        ("schedule-pause", "cli", "nightly", 1, "month-end freeze"),
        ("schedule-resume", "cli", "nightly", 1, None),
        ("schedule-trigger", "cli", "nightly", 1, None),
        ("schedule-backfill", "cli", "nightly", 2, None),  # the dry run is not an action
        ("queue-pause", "console", "mail", 1, None),
        ("schedule-pause", "console", "nightly", 1, "from the console"),
    ]
    assert actions[2]["details"]["instance_id"] == triggered
    assert actions[3]["details"]["ticks"] == 2 and actions[3]["details"]["batches"] == 1
    assert "@" in actions[0]["actor"]  # the CLI's user@host
    assert "127.0.0.1" in actions[4]["actor"]  # the console's client address
