"""The operator CLI as a real process: instances list/show/cancel/retry, start, send."""

from __future__ import annotations

import json

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.apps import core
from tests.logguard import expect_log
from tests.support import executions, running_worker
from tests.support import kenning_command as kenning


async def test_start_list_show_and_cancel(database: Database, database_url: str) -> None:
    start = ("start", "three_steps", "--app", "tests.apps.core", "--input", '{"value": 5}', "--instance-id", "cli-1")
    started = kenning(*start, "--json", url=database_url)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {"instance_id": "cli-1", "created": True}
    again = kenning(*start, "--json", url=database_url)
    assert json.loads(again.stdout)["created"] is False

    async with running_worker(database, core.app):
        assert await Client(database=database).result("cli-1", timeout=10) == 9
    listed = kenning("instances", "list", "--status", "completed", url=database_url)
    assert listed.returncode == 0 and "cli-1" in listed.stdout and "three_steps" in listed.stdout
    assert "ID" in listed.stdout.splitlines()[0]
    assert kenning("instances", "list", "--status", "failed", "--json", url=database_url).stdout.strip() == "[]"

    shown = kenning("instances", "show", "cli-1", "--json", url=database_url)
    detail = json.loads(shown.stdout)
    assert detail["status"] == "completed" and detail["result"] == {"result": 9}
    assert [h["step_id"] for h in detail["history"]] == ["step_one:1", "step_two:1", "step_three:1"]
    human = kenning("instances", "show", "cli-1", url=database_url).stdout
    assert "ActivityCompleted" in human and "step_two:1" in human

    async with Client(database=database) as client:
        waiting = await client.start(core.sleeper, seconds=3600)
        async with running_worker(database, core.app):
            cancelled = kenning("instances", "cancel", waiting.instance_id, url=database_url)
            assert cancelled.returncode == 0 and "cancellation requested" in cancelled.stdout
            assert cancelled.stderr == "", "no log line after the command's own output"
            with pytest.raises(WorkflowFailedError, match="cancelled"):
                await client.result(waiting.instance_id, timeout=10)
    # cancelling a finished instance says so and exits non-zero
    assert kenning("instances", "cancel", "cli-1", url=database_url).returncode == 1


async def test_retry_reruns_a_failed_instance_from_its_failed_step(
    database: Database, database_url: str, side_channel: str, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    expect_log("instance.failed", workflow="retrying")
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.retrying, failures=5)  # FAST allows 3 attempts: fails
        with pytest.raises(WorkflowFailedError, match="RetryExhaustedError"):
            await client.result(started.instance_id, timeout=10)
        retried = kenning("instances", "retry", started.instance_id, url=database_url)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert "1 failed step(s) will run anew" in retried.stdout
        assert await client.result(started.instance_id, timeout=10) == "ok"
    assert executions(side_channel)[f"flaky {started.instance_id}"] == 6


async def test_retry_is_refused_after_compensations_ran(database: Database, database_url: str) -> None:
    expect_log("instance.failed", workflow="saga")
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.saga, amount=1, fail=True)
        with pytest.raises(WorkflowFailedError):
            await client.result(started.instance_id, timeout=10)
    refused = kenning("instances", "retry", started.instance_id, url=database_url)
    assert refused.returncode == 1
    assert "compensation(s) already undid its steps" in refused.stdout


def test_clear_errors_and_exit_codes(database_url: str) -> None:
    unknown = kenning("instances", "show", "nope", url=database_url)
    assert unknown.returncode == 2 and "no workflow instance 'nope'" in unknown.stderr
    bad_json = kenning("start", "three_steps", "--input", "{oops", url=database_url)
    assert bad_json.returncode == 2 and "invalid JSON" in bad_json.stderr
    bad_url = kenning("instances", "list", url="mysql://x/y")
    assert bad_url.returncode == 2 and "database URL must start with postgresql://" in bad_url.stderr
    down = kenning("instances", "list", url="postgresql://nobody@127.0.0.1:1/x")
    assert down.returncode == 1 and "database error" in down.stderr and "unavailable: try again" in down.stderr
    unreachable = kenning("send", "order.created", "--data", "{}", "--ingress-url", "http://127.0.0.1:1")
    assert unreachable.returncode == 2 and "cannot reach the ingress" in unreachable.stderr
    for result in (unknown, bad_json, bad_url, down, unreachable):
        assert "Traceback" not in result.stderr
