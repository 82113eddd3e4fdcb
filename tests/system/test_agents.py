"""Durable Pydantic AI agents through real worker processes (issue 34, items 2 and 4): a
worker SIGKILLed between the agent's second and third model request resumes from the
recorded steps, and an approval given after every process restarted lets the agent
finish. The model is a scripted ``FunctionModel`` (tests/apps/agents.py): no network, no
key; model calls and tool runs are counted through the side channel, across processes."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.console_support import action_lines, became, console_ready, post_form, spawn_console
from tests.logguard import expect_log
from tests.sidechannel import executions
from tests.support import ProcessPool, check_invariants, eventually
from tests.support import kenning_command as kenning

APP = "tests.apps.agents"
Sql = psycopg.Connection[tuple[object, ...]]


def counted(side_channel: str, prefix: str) -> dict[str, int]:
    return {label: n for label, n in executions(side_channel).items() if label.startswith(prefix)}


def step_names(sql: Sql, instance_id: str) -> list[object]:
    rows = sql.execute(
        "SELECT step_name FROM kenning_history WHERE instance_id = %s AND kind = 'ActivityCompleted' ORDER BY seq",
        (instance_id,),
    ).fetchall()
    return [name for (name,) in rows if not str(name).endswith("event_stream_handler")]


async def test_a_worker_killed_between_model_requests_resumes_without_asking_again(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_BLOCK_FILE": str(block)}
    first = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    async with Client(database=database) as client:
        instance = (await client.start("agent_steps", question="where is order o-1?")).instance_id
        # two model requests and both tools recorded; the third request not yet made
        await eventually(
            lambda: executions(side_channel)["model 3 waiting"] == 1, timeout=60, message="third request reached"
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        assert await client.result(instance, timeout=60) == "order o-1 is settled"
        events = [entry.value async for entry in client.read_stream(instance, "agent")]
    # as they happened, each once: the third request's text came from its one real call
    call_then_result = ["function_tool_call", "function_tool_result"]
    kinds = [event["event_kind"] for event in events]
    assert kinds[:5] == [*call_then_result, *call_then_result, "part_start"]
    assert set(kinds[5:-1]) == {"part_delta"} and kinds[-1] == "agent_output"
    text = events[4]["part"]["content"] + "".join(event["delta"]["content_delta"] for event in events[5:-1])
    assert text == "order o-1 is settled"
    assert events[-1] == {"event_kind": "agent_output", "output": "order o-1 is settled"}
    assert counted(side_channel, "model ") == {"model 1": 1, "model 2": 1, "model 3": 1, "model 3 waiting": 2}
    assert counted(side_channel, "tool ") == {"tool lookup": 1, "tool check_policy": 1}
    assert step_names(sql, instance) == [
        "steps__model.request_stream",
        "steps__function_toolset__<agent>.call_tool:lookup",
        "steps__model.request_stream",
        "steps__function_toolset__<agent>.call_tool:check_policy",
        "steps__model.request_stream",
    ]
    check_invariants(sql)


async def test_an_approval_given_after_every_process_restarted_lets_the_agent_finish(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    first = processes.worker(database_url, APP, env=env)
    async with Client(database=database) as client:
        instance = (await client.start("agent_refund", question="refund 30 on o-1")).instance_id

        def waits_for_a_person() -> bool:
            row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
            return row == ("waiting_for_message",)

        await eventually(waits_for_a_person, timeout=60, message="the refund waits for approval")
        pending = await client.get_value(instance, "approvals")
        assert pending == {
            "pending": [
                {"call_id": "call-refund", "details": {"tool": "refund", "args": {"order_id": "o-1", "amount": 30}}}
            ],
            "resolved": [],
        }
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    processes.stop_all()

    # every process is gone; a new one comes up, and a person decides from a shell
    processes.worker(database_url, APP, env=env)
    wrong = await asyncio.to_thread(
        kenning,
        "request",
        instance,
        "approval",
        '{"call_id": "nope", "approved": true}',
        "--timeout",
        "60",
        url=database_url,
    )
    assert wrong.returncode == 1, wrong.stderr
    assert "no approval is waiting for call 'nope' (waiting: call-refund)" in wrong.stderr
    approved = await asyncio.to_thread(
        kenning,
        "request",
        instance,
        "approval",
        '{"call_id": "call-refund", "approved": true}',
        "--timeout",
        "60",
        url=database_url,
    )
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout) == {"call_id": "call-refund", "approved": True}
    async with Client(database=database) as client:
        assert await client.result(instance, timeout=60) == "order o-1 is settled"
        decided = await client.get_value(instance, "approvals")
    assert decided == {"pending": [], "resolved": [{"call_id": "call-refund", "approved": True, "reason": None}]}
    assert counted(side_channel, "model ") == {"model 1": 1, "model 2": 1, "model 3": 1}
    assert counted(side_channel, "tool ") == {"tool lookup": 1, "tool refund": 1}
    check_invariants(sql)


async def test_a_bare_agent_run_is_refused_in_an_app_that_never_imported_kenning_ai(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    expect_log("instance.failed")
    processes.worker(database_url, "tests.apps.bare_agent")
    async with Client(database=database) as client:
        instance = (await client.start("bare_agent", question="hi")).instance_id
        with pytest.raises(WorkflowFailedError, match="agent bare was run directly in Kenning workflow code"):
            await client.result(instance, timeout=60)


async def test_a_person_denies_a_refund_with_the_consoles_button(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    url, console = spawn_console(processes, database_url, app=APP)
    await console_ready(url, console)
    async with Client(database=database) as client:
        instance = (await client.start("agent_refund", question="refund 30 on o-1")).instance_id
        await became(sql, instance, "waiting_for_message")
        async with httpx.AsyncClient(base_url=url, timeout=10, follow_redirects=False) as browser:
            page = await browser.get(f"/instances/{instance}")
            assert "Decide 1 approval(s)" in page.text
            asked = await browser.get(f"/instances/{instance}/approvals")
            assert asked.status_code == 200 and 'data-approval="call-refund"' in asked.text and "refund" in asked.text
            wrong = await post_form(browser, f"/instances/{instance}/approvals", {"call_id": "x", "decision": "deny"})
            assert wrong.status_code == 409 and "no approval is waiting for call &#39;x&#39;" in wrong.text
            fields = {"call_id": "call-refund", "decision": "deny", "reason": "over the limit"}
            denied = await post_form(browser, f"/instances/{instance}/approvals", fields)
            assert denied.status_code == 303, denied.text
            assert await client.result(instance, timeout=60) == "order o-1 is settled"
            assert (await client.get_value(instance, "approvals"))["resolved"] == [
                {"call_id": "call-refund", "approved": False, "reason": "over the limit"}
            ]
            again = await post_form(browser, f"/instances/{instance}/approvals", fields)
            assert again.status_code == 409
    assert counted(side_channel, "tool ") == {"tool lookup": 1}
    (line,) = action_lines(processes.log_of(console), "approval")
    assert (line["instance_id"], line["call_id"], line["approved"]) == (instance, "call-refund", False)
