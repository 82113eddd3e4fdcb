"""``kenning mcp`` as an assistant meets it: a real ``kenning mcp`` process, spoken to
with the official ``mcp`` client library over stdio and over streamable HTTP, against a
database holding real instances (run by an in-process worker): every tool, the
refusal of actions when read-only, bad arguments answered as one-line tool errors,
answers bounded, actions in the action log with the client's identity, the bearer token
and the refusal to listen beyond loopback without one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, Implementation, TextContent

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from kenning.storage.schedules import ScheduleDeclaration, schedules_declare
from tests.apps import core, published
from tests.logguard import LogGuard, expect_log
from tests.support import REPO_ROOT, ProcessPool, free_port, kenning_command, running_worker, until_answering

Sql = psycopg.Connection[tuple[object, ...]]
TOOLS = {
    "search_instances",
    "show_instance",
    "list_workers",
    "list_queues",
    "list_schedules",
    "list_actions",
    "replay_check",
    "cancel_instance",
    "retry_instance",
    "terminate_instance",
    "skip_compensation",
    "fork_instance",
    "bulk_action",
    "pause_schedule",
    "resume_schedule",
    "trigger_schedule",
}
BLOB = "x" * 100_000
CLIENT = Implementation(name="kenning-tests", version="1")


def _text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    answer: dict[str, Any] = json.loads(_text(result))
    return answer


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The tool error's text: one line, no traceback."""
    result = await session.call_tool(tool, arguments)
    text = _text(result)
    assert result.is_error, text
    assert "\n" not in text and "Traceback" not in text, text
    return text


@contextlib.asynccontextmanager
async def stdio_session(database_url: str, log: Path, *extra: str) -> AsyncIterator[ClientSession]:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kenning", "mcp", "--no-migrate", *extra],
        env={"PYTHONPATH": str(REPO_ROOT), "KENNING_DATABASE_URL": database_url, "KENNING_LOG_FORMAT": "json"},
        cwd=REPO_ROOT,
    )
    with log.open("a") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write, client_info=CLIENT) as session,
        ):
            await session.initialize()
            yield session


async def _instances(database: Database, sql: Sql) -> dict[str, str]:
    """A completed instance, a failed saga, a sleeping one, an order waiting for a message
    (searchable by its region), one that published a 100 kB value, and a schedule."""
    expect_log("instance.failed", workflow="saga")
    ids: dict[str, str] = {}
    async with Client(database=database) as client:
        async with running_worker(database, core.app):
            done = await client.start(core.three_steps, value=5)
            assert await client.result(done.instance_id, timeout=10) == 9
            failed = await client.start(core.saga, amount=1, fail=True)
            try:
                await client.result(failed.instance_id, timeout=10)
            except WorkflowFailedError:
                pass
            sleeping = await client.start(core.sleeper, seconds=3600)
            ids.update(done=done.instance_id, failed=failed.instance_id, sleeping=sleeping.instance_id)
        async with running_worker(database, published.app):
            order = await client.start(published.published_order, customer="acme", region="eu")
            ids["order"] = order.instance_id
            await _until_status(sql, order.instance_id, "waiting_for_message")  # published, waiting for "go"
            big = await client.start(published.publishes_later)
            ids["big"] = big.instance_id
            await _until_status(sql, big.instance_id, "waiting_for_message")
            await client.send_message(big.instance_id, "go", {"blob": BLOB})
            await _until_value(sql, big.instance_id, "answer")
        await _until_status(sql, sleeping.instance_id, "waiting_for_timer")
    async with database.connection() as conn:
        await schedules_declare(conn, [ScheduleDeclaration("nightly", "0 3 * * *", "UTC", "skip")])
    return ids


async def _pause() -> None:
    await asyncio.sleep(0.05)  # polled with a deadline (the loop's count), not a wait for correctness


async def _until_status(sql: Sql, instance_id: str, status: str) -> None:
    for _ in range(200):
        row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
        if row is not None and row[0] == status:
            return
        await _pause()
    raise AssertionError(f"{instance_id} never became {status}")


async def _until_value(sql: Sql, instance_id: str, key: str) -> None:
    for _ in range(200):
        query = "SELECT 1 FROM kenning_values WHERE instance_id = %s AND key = %s"
        if sql.execute(query, (instance_id, key)).fetchone() is not None:
            return
        await _pause()
    raise AssertionError(f"{instance_id} never published {key!r}")


async def test_read_only_over_stdio_every_read_tool_and_refusals(
    database: Database, database_url: str, sql: Sql, tmp_path: Path, log_guard: LogGuard
) -> None:
    ids = await _instances(database, sql)
    log = tmp_path / "mcp-stdio.log"
    log_guard.watch_file("kenning mcp", log)
    async with stdio_session(database_url, log) as session:
        assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS

        found = await ok(session, "search_instances", where={"region": "eu"})
        assert [i["id"] for i in found["instances"]] == [ids["order"]]
        ranked = await ok(
            session, "search_instances", where={"region": "eu", "priority": 0}, workflow="published_order"
        )
        assert [i["id"] for i in ranked["instances"]] == [ids["order"]]
        assert (await ok(session, "search_instances", where={"priority": 1}))["instances"] == []
        first = await ok(session, "search_instances", limit=1)
        assert len(first["instances"]) == 1 and first["next_cursor"]
        rest = await ok(session, "search_instances", limit=100, cursor=first["next_cursor"])
        assert len(rest["instances"]) == 4 and rest["next_cursor"] is None
        failed = await ok(session, "search_instances", status="failed", created_after="2000-01-01T00:00:00Z")
        assert [i["id"] for i in failed["instances"]] == [ids["failed"]]

        # "why is the order stuck?": what it waits for, its values, its history
        shown = await ok(session, "show_instance", instance_id=ids["order"])
        assert shown["instance"]["status"] == "waiting_for_message"
        assert "a message on topic 'go'" in shown["why"]["way_forward"]
        assert {v["key"] for v in shown["published_values"]} >= {"customer", "region", "priority"}
        assert shown["history"] and shown["streams"] == []
        done = await ok(session, "show_instance", instance_id=ids["done"], history_limit=2)
        assert [h["step_id"] for h in done["history"]] == ["step_one:1", "step_two:1"]
        assert done["history_next"] == done["history"][-1]["seq"]
        tail = await ok(session, "show_instance", instance_id=ids["done"], history_after=done["history_next"])
        assert [h["step_id"] for h in tail["history"]] == ["step_three:1"] and tail["history_next"] is None
        # a 100 kB value: shown as a preview, the answer bounded
        raw = await session.call_tool("show_instance", {"instance_id": ids["big"]})
        assert not raw.is_error and len(_text(raw).encode()) < 64_000 and BLOB not in _text(raw)
        (answer,) = [v for v in json.loads(_text(raw))["published_values"] if v["key"] == "answer"]
        assert answer["value"] is None and answer["size"] > 100_000 and answer["preview"].startswith('{"blob"')
        sleeping = await ok(session, "show_instance", instance_id=ids["sleeping"])
        assert sleeping["waits"]["timers"] and "timer" in sleeping["why"]["way_forward"]
        saga = await ok(session, "show_instance", instance_id=ids["failed"])
        assert [c["ran_kind"] for c in saga["compensations"]] == ["CompensationExecuted"] * 2

        assert (await ok(session, "list_workers"))["processes"] == []  # in-process workers do not register
        # the queues the database holds: an in-process worker declares every queue its test
        # process has imported (other modules' apps too, under xdist)
        declared = [row[0] for row in sql.execute("SELECT name FROM kenning_queues ORDER BY name")]
        assert sorted(q["name"] for q in (await ok(session, "list_queues"))["queues"]) == declared
        assert [s["workflow_name"] for s in (await ok(session, "list_schedules"))["schedules"]] == ["nightly"]
        assert (await ok(session, "list_actions"))["actions"] == []

        # refused: actions while read-only, replay_check without --app, bad arguments
        for tool, arguments in [
            ("cancel_instance", {"instance_id": ids["sleeping"]}),
            ("retry_instance", {"instance_id": ids["failed"]}),
            ("terminate_instance", {"instance_id": ids["sleeping"], "reason": "no"}),
            ("skip_compensation", {"instance_id": ids["failed"], "reason": "no"}),
            ("fork_instance", {"instance_id": ids["done"], "from_step": "2"}),
            ("bulk_action", {"action": "cancel", "workflow": "sleeper"}),
            ("pause_schedule", {"name": "nightly"}),
            ("resume_schedule", {"name": "nightly"}),
            ("trigger_schedule", {"name": "nightly"}),
        ]:
            assert "read-only" in await refused(session, tool, **arguments), tool
        assert "--app" in await refused(session, "replay_check")
        assert "limit" in await refused(session, "search_instances", limit=500)
        assert "instance_id" in await refused(session, "show_instance")
        assert "no workflow instance 'nope'" in await refused(session, "show_instance", instance_id="nope")
        assert "not a time" in await refused(session, "search_instances", created_after="yesterday")
        assert "not a status" in await refused(session, "search_instances", status="stuck")
        assert "not a cursor" in await refused(session, "search_instances", cursor="page-2")
        assert "kind" in await refused(session, "list_workers", kind="robot")
    assert sql.execute("SELECT count(*) FROM kenning_operator_actions").fetchone() == (0,)
    assert sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (ids["sleeping"],)).fetchone() == (
        "waiting_for_timer",
    )


async def test_actions_over_stdio_are_logged_with_the_os_user(
    database: Database, database_url: str, sql: Sql, tmp_path: Path, log_guard: LogGuard
) -> None:
    ids = await _instances(database, sql)
    log = tmp_path / "mcp-stdio.log"
    log_guard.watch_file("kenning mcp", log)
    async with stdio_session(database_url, log, "--allow-actions", "--app", "tests.apps.core") as session:
        checked = await ok(session, "replay_check")
        assert checked["diverged"] == 0 and checked["checked"] >= 2

        cancelled = await ok(session, "cancel_instance", instance_id=ids["sleeping"])
        assert cancelled["done"] and cancelled["message"] == "cancellation requested"
        retried = await ok(session, "retry_instance", instance_id=ids["failed"])
        assert not retried["done"] and "compensation" in retried["message"]
        skipped = await ok(session, "skip_compensation", instance_id=ids["done"], reason="nothing to skip")
        assert not skipped["done"]
        assert "reason" in await refused(session, "terminate_instance", instance_id=ids["order"])
        ended = await ok(session, "terminate_instance", instance_id=ids["order"], reason="customer gone")
        assert ended["done"]

        # bulk: a dry run first, its token for the same filter, once
        assert "dry run" in await refused(session, "bulk_action", action="retry", dry_run=False)
        dry = await ok(session, "bulk_action", action="retry", workflow="saga")
        assert dry["matched"] == 1 and dry["confirm_token"] and dry["action_id"] is None
        other = {"action": "retry", "workflow": "three_steps", "dry_run": False, "confirm_token": dry["confirm_token"]}
        assert "another action or filter" in await refused(session, "bulk_action", **other)
        real = await ok(
            session, "bulk_action", action="retry", workflow="saga", dry_run=False, confirm_token=dry["confirm_token"]
        )
        assert real["matched"] == 1 and real["action_id"] is not None
        reused = {"action": "retry", "workflow": "saga", "dry_run": False, "confirm_token": dry["confirm_token"]}
        assert "unknown or expired" in await refused(session, "bulk_action", **reused)

        # a fork of the completed three steps from its second: one record kept, runnable
        assert "out of range" in await refused(session, "fork_instance", instance_id=ids["done"], from_step="9")
        forked = await ok(session, "fork_instance", instance_id=ids["done"], from_step="step_two:1")
        assert (forked["step"], forked["kept"], forked["instance_id"]) == (2, 1, ids["done"])
        assert sql.execute(
            "SELECT status, forked_from FROM kenning_instances WHERE id = %s", (forked["fork_id"],)
        ).fetchone() == (
            "pending",
            ids["done"],
        )

        assert (await ok(session, "pause_schedule", name="nightly", reason="freeze"))["paused"] is True
        assert (await ok(session, "resume_schedule", name="nightly"))["paused"] is False
        triggered = await ok(session, "trigger_schedule", name="nightly")
        assert triggered["created"] and triggered["instance_id"].startswith("nightly@")
        assert "no schedule 'daily'" in await refused(session, "trigger_schedule", name="daily")

        logged = (await ok(session, "list_actions", limit=100))["actions"]
    kinds = [a["action"] for a in reversed(logged)]
    assert kinds == [
        "cancel",
        "retry",
        "skip-compensation",
        "terminate",
        "retry",
        "fork",
        "schedule-pause",
        "schedule-resume",
        "schedule-trigger",
    ]
    user = os.environ.get("USER") or ""
    for action in logged:
        assert action["origin"] == "mcp" and action["actor"].endswith("(kenning-tests)"), action
        assert user in action["actor"]
    terminated = next(a for a in logged if a["action"] == "terminate")
    assert terminated["target"] == ids["order"] and terminated["reason"] == "customer gone"


async def test_streamable_http_with_a_bearer_token_or_open_on_loopback(
    processes: ProcessPool, database: Database, database_url: str, sql: Sql
) -> None:
    ids = await _instances(database, sql)
    port = free_port()
    env = {"KENNING_DATABASE_URL": database_url, "KENNING_MCP_TOKEN": "s3cret"}
    proc = processes.spawn(
        ["mcp", "--transport", "http", "--port", str(port), "--allow-actions", "--no-migrate"], env=env, name="mcp"
    )
    base = f"http://127.0.0.1:{port}"
    await until_answering(f"{base}/healthz", proc, "kenning mcp")

    async with httpx.AsyncClient(timeout=10) as plain:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        missing = await plain.post(f"{base}/mcp", json=hello)
        assert missing.status_code == 401 and "no bearer token" in missing.json()["error"]
        wrong = await plain.post(f"{base}/mcp", json=hello, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "wrong bearer token"

    async with http_session(f"{base}/mcp", token="s3cret") as session:
        assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
        found = await ok(session, "search_instances", where={"region": "eu"})
        assert [i["id"] for i in found["instances"]] == [ids["order"]]
        assert "limit" in await refused(session, "list_actions", limit=0)
        cancelled = await ok(session, "cancel_instance", instance_id=ids["sleeping"])
        assert cancelled["done"]
        (action,) = (await ok(session, "list_actions"))["actions"]
    assert action["origin"] == "mcp" and action["actor"] == "bearer-token@127.0.0.1 (kenning-tests)"
    assert action["action"] == "cancel" and action["target"] == ids["sleeping"]

    # without a token, on loopback: open, and the action log says so
    open_port = free_port()
    opened = processes.spawn(
        ["mcp", "--transport", "http", "--port", str(open_port), "--allow-actions", "--no-migrate"],
        env={"KENNING_DATABASE_URL": database_url},
        name="mcp-open",
    )
    await until_answering(f"http://127.0.0.1:{open_port}/healthz", opened, "kenning mcp")
    async with http_session(f"http://127.0.0.1:{open_port}/mcp") as session:
        assert (await ok(session, "pause_schedule", name="nightly"))["paused"] is True
        latest = (await ok(session, "list_actions", limit=1))["actions"][0]
    assert latest["action"] == "schedule-pause" and latest["actor"] == "open@127.0.0.1 (kenning-tests)"


@contextlib.asynccontextmanager
async def http_session(url: str, token: str = "") -> AsyncIterator[ClientSession]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"} if token else None)
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, client_info=CLIENT) as session,
    ):
        await session.initialize()
        yield session


def test_http_refuses_to_listen_beyond_loopback_without_a_token(database_url: str) -> None:
    port = str(free_port())
    done = kenning_command("mcp", "--transport", "http", "--host", "0.0.0.0", "--port", port, url=database_url)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kenning mcp: refusing to listen on 0.0.0.0 without KENNING_MCP_TOKEN"), line
