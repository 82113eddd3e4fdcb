"""``@on_failure`` compensations are called as Edda calls them, by name; one that cannot
succeed leaves its instance visibly failed, and ``kenning instances retry`` finishes the
rollback after a deploy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.apps import compensation_binding as flights
from tests.logguard import expect_log
from tests.support import REPO_ROOT, eventually, executions, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


def kenning(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "kenning", *args],
        capture_output=True,
        text=True,
        env={**env, "KENNING_DATABASE_URL": url},
        cwd=REPO_ROOT,
        timeout=60,
    )


def outcomes(sql: Sql, instance_id: str) -> dict[str, str]:
    """step id -> kind of the instance's compensation records."""
    rows = sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s AND step_id LIKE 'compensation:%%'",
        (instance_id,),
    ).fetchall()
    return {str(step): str(kind) for step, kind in rows}


def instance(sql: Sql, instance_id: str) -> tuple[str, dict[str, Any]]:
    row = sql.execute("SELECT status, error FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return str(row[0]), row[1]  # type: ignore[return-value]


async def test_the_edda_example_compensates_by_name(database: Database, side_channel: str, sql: Sql) -> None:
    expect_log("instance.failed", workflow="book_flight")  # the card is declined on purpose
    async with Client(database=database) as client, running_worker(database, flights.app):
        started = await client.start(flights.book_flight, seat="12A", amount=30)
        with pytest.raises(WorkflowFailedError, match="card declined"):
            await client.result(started.instance_id, timeout=15)
    assert outcomes(sql, started.instance_id) == {"compensation:on_failure:reserve_seat:1": "CompensationExecuted"}
    assert executions(side_channel)[f"cancel_reservation:res-12A {started.instance_id}"] == 1
    status, error = instance(sql, started.instance_id)
    assert status == "failed" and error["type"] == "kenning.errors.TerminalError"


async def test_a_failing_compensation_leaves_the_instance_failed_naming_it_and_retry_runs_it_after_a_deploy(
    database: Database, database_url: str, side_channel: str, sql: Sql, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect_log("instance.failed", workflow="hold_then_charge")
    expect_log("compensation.failed", compensation="tests.apps.compensation_binding:release_hold")
    async with Client(database=database) as client, running_worker(database, flights.app):
        started = await client.start(flights.hold_then_charge, seat="7C", amount=30)
        instance_id = started.instance_id
        with pytest.raises(
            WorkflowFailedError, match=re.escape("compensation tests.apps.compensation_binding:release_hold")
        ):
            await client.result(instance_id, timeout=15)
        status, error = instance(sql, instance_id)
        assert status == "failed" and error["type"] == "kenning.compensation.CompensationFailedError"
        assert "hold service rejects the release of hold-7C" in error["message"]
        assert "card declined for 30" in error["message"]  # what the saga was undoing
        # the rollback went on with the older step
        assert outcomes(sql, instance_id) == {
            "compensation:on_failure:hold_seat:1": "CompensationFailed",
            "compensation:on_failure:reserve_seat:1": "CompensationExecuted",
        }
        shown = kenning("instances", "show", instance_id, url=database_url)
        assert shown.returncode == 0, shown.stderr
        assert "CompensationFailedError" in shown.stdout
        assert "release_hold failed: RuntimeError: hold service rejects the release of hold-7C" in shown.stdout
        assert "executed" in shown.stdout
        detail = json.loads(kenning("instances", "show", instance_id, "--json", url=database_url).stdout)
        assert [c["outcome"] for c in detail["compensations"]] == ["executed", "failed"]

        monkeypatch.setattr(flights, "HOLD_SERVICE_FIXED", True)  # the deploy
        retried = kenning("instances", "retry", instance_id, url=database_url)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert "1 failed compensation(s) will run again" in retried.stdout
        await eventually(
            lambda: outcomes(sql, instance_id).get("compensation:on_failure:hold_seat:1") == "CompensationExecuted",
            message="the retried compensation ran",
        )
        await eventually(lambda: instance(sql, instance_id)[0] == "failed", message="the saga ended")
    status, error = instance(sql, instance_id)
    assert error["type"] == "kenning.errors.TerminalError"  # the workflow's own error again
    assert executions(side_channel)[f"release_hold:7C:hold-7C {instance_id}"] == 1
    assert executions(side_channel)[f"cancel_reservation:res-7C {instance_id}"] == 1  # not run twice
    refused = kenning("instances", "retry", instance_id, url=database_url)
    assert refused.returncode == 1 and "already undid its steps" in refused.stdout


async def test_a_cancelled_saga_whose_compensation_fails_ends_cancelled_once_retried(
    database: Database, database_url: str, side_channel: str, sql: Sql, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect_log("compensation.failed", compensation="tests.apps.compensation_binding:release_hold")
    async with Client(database=database) as client, running_worker(database, flights.app):
        started = await client.start(flights.hold_then_wait, seat="3F")
        instance_id = started.instance_id
        await eventually(lambda: instance(sql, instance_id)[0] == "waiting_for_timer")
        await client.cancel(instance_id)
        with pytest.raises(WorkflowFailedError, match=r"ended failed: .*release_hold"):
            await client.result(instance_id, timeout=15)
        assert "cancelled" in instance(sql, instance_id)[1]["message"]

        monkeypatch.setattr(flights, "HOLD_SERVICE_FIXED", True)
        assert kenning("instances", "retry", instance_id, url=database_url).returncode == 0
        await eventually(lambda: instance(sql, instance_id)[0] == "cancelled", message="the saga ended cancelled")
    assert instance(sql, instance_id)[1] is None
    assert executions(side_channel)[f"release_hold:3F:hold-3F {instance_id}"] == 1


async def test_a_result_without_the_parameter_fails_the_compensation_naming_it(
    database: Database, side_channel: str, sql: Sql
) -> None:
    expect_log("instance.failed", workflow="ticket_then_charge")
    expect_log("compensation.failed", compensation="tests.apps.compensation_binding:void_ticket")
    async with Client(database=database) as client, running_worker(database, flights.app):
        started = await client.start(flights.ticket_then_charge, seat="1A", amount=5)
        with pytest.raises(WorkflowFailedError, match="void_ticket"):
            await client.result(started.instance_id, timeout=15)
    _, error = instance(sql, started.instance_id)
    assert "missing parameter 'ticket_id'" in error["message"]
    assert "available: seat, ticket" in error["message"]
    assert outcomes(sql, started.instance_id) == {"compensation:on_failure:issue_ticket:1": "CompensationFailed"}
    assert not any(label.startswith("void_ticket") for label in executions(side_channel))
