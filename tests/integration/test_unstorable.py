"""Values PostgreSQL cannot store are the step's error, decided before any write (issue 13, item 2).

Before, an activity returning ``"a\\x00b"`` made every write of its record fail with
``UntranslatableCharacter``; the worker released the instance, another run replayed it,
and the activity's outside effect repeated on each run, forever.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database, Executor
from kenning.storage import instances as instances_sql
from tests.apps import limits, saga_refusals
from tests.logguard import expect_log
from tests.support import eventually, executions, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


def history(sql: Sql, instance_id: str) -> list[tuple[str, str, Any]]:
    rows = sql.execute(
        "SELECT step_id, kind, payload FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()
    return [(str(a), str(b), c) for a, b, c in rows]


def instance(sql: Sql, instance_id: str) -> tuple[str, Any, int]:
    row = sql.execute("SELECT status, error, run_count FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return str(row[0]), row[1], int(str(row[2]))


async def settled(sql: Sql, instance_id: str) -> str:
    """Waits until the instance is finished; a replay loop never gets there."""

    def done() -> str:
        status = instance(sql, instance_id)[0]
        return status if status in ("completed", "failed", "cancelled") else ""

    return await eventually(done, timeout=30, message=f"instance {instance_id} finished")


async def test_activity_returning_a_nul_runs_once_and_the_saga_is_undone(
    database: Database, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="unstorable_result")
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.unstorable_result)
        assert await settled(sql, started.instance_id) == "failed"
    iid = started.instance_id
    counts = executions(side_channel)
    assert counts[f"returns_nul {iid}"] == 1  # a TerminalError: not retried, not replayed
    assert counts[f"book {iid}"] == 1
    assert counts[f"cancel_booking {iid}"] == 1  # the workflow's error: its saga is undone
    status, error, run_count = instance(sql, iid)
    assert (status, run_count) == ("failed", 1)
    assert error["type"] == "kenning.errors.UnstorableValueError"
    assert error["message"] == (
        "activity returns_nul: result cannot be stored: contains a NUL character at $ "
        "(PostgreSQL text and jsonb refuse it)"
    )
    steps = [(s, k) for s, k, _ in history(sql, iid)]
    assert steps == [
        ("book:1", "ActivityCompleted"),
        ("returns_nul:1", "ActivityFailed"),
        ("compensation:on_failure:book:1", "CompensationExecuted"),
    ]


async def test_the_workflow_can_catch_it_and_the_path_names_the_field(
    database: Database, sql: Sql, side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.unstorable_result, nested=True, catch=True)
        result = await client.result(started.instance_id, timeout=30)
    assert result == (
        "caught: activity returns_nul: result cannot be stored: contains a NUL character at $.items[1].name "
        "(PostgreSQL text and jsonb refuse it)"
    )
    assert executions(side_channel)[f"returns_nul {started.instance_id}"] == 1


async def test_nan_from_a_sync_activity_is_refused_too(database: Database, sql: Sql, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.unstorable_number)
        result = await client.result(started.instance_id, timeout=30)
    assert result == (
        "caught: activity returns_nan: result cannot be stored: contains NaN or an infinity at $ "
        "(JSON has no such number)"
    )
    assert executions(side_channel)[f"returns_nan {started.instance_id}"] == 1


async def test_an_error_message_with_a_nul_is_stored_escaped(database: Database, sql: Sql, side_channel: str) -> None:
    expect_log("instance.failed", workflow="nul_error")
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.nul_error)
        with pytest.raises(WorkflowFailedError, match=r"card\\x00declined"):
            await client.result(started.instance_id, timeout=30)
    assert executions(side_channel)[f"fails_with_nul {started.instance_id}"] == 1
    (step,) = history(sql, started.instance_id)
    assert step[:2] == ("fails_with_nul:1", "ActivityFailed")
    assert step[2]["message"] == "card\\x00declined"
    assert "\\x00" in step[2]["traceback"]


async def test_a_workflow_result_with_a_nul_fails_the_instance_once(
    database: Database, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="nul_workflow_result")
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.nul_workflow_result)
        with pytest.raises(WorkflowFailedError, match="workflow nul_workflow_result: result cannot be stored"):
            await client.result(started.instance_id, timeout=30)
    iid = started.instance_id
    assert instance(sql, iid)[2] == 1
    counts = executions(side_channel)
    assert counts[f"book {iid}"] == 1
    assert counts[f"cancel_booking {iid}"] == 1  # the instance failed: its saga is undone


async def test_a_compensation_argument_with_a_nul_fails_the_step(
    database: Database, sql: Sql, side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.nul_compensation_argument)
        result = await client.result(started.instance_id, timeout=30)
    assert result == (
        "caught: activity hold: compensation tests.apps.limits:cancel_booking arguments cannot be stored: "
        "contains a NUL character at $.booking (PostgreSQL text and jsonb refuse it)"
    )
    assert executions(side_channel)[f"hold {started.instance_id}"] == 1
    assert [(s, k) for s, k, _ in history(sql, started.instance_id)] == [("hold:1", "ActivityFailed")]


@pytest.mark.parametrize("nul_in_type", [False, True])
async def test_a_write_the_database_refuses_is_the_steps_error_not_an_outage(
    database: Database, sql: Sql, side_channel: str, nul_in_type: bool
) -> None:
    """No check before the write here (wait_event's match, its event type): PostgreSQL's
    refusal (22P05 for jsonb; psycopg's own for a text parameter) fails the step, once."""
    expect_log("instance.failed", workflow="nul_in_match")
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.nul_in_match, nul_in_type=nul_in_type)
        with pytest.raises(WorkflowFailedError, match=r"UnstorableValueError: .*cannot be stored"):
            await client.result(started.instance_id, timeout=30)
    iid = started.instance_id
    assert instance(sql, iid)[2] == 1  # run once: never released and replayed
    counts = executions(side_channel)
    assert counts[f"book {iid}"] == 1
    assert counts[f"cancel_booking {iid}"] == 1
    assert sql.execute("SELECT count(*) FROM kenning_event_subscriptions").fetchone() == (0,)


def refuse_unsaved_compensations(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL refuses the compensations riding in the statement that makes the instance
    ``compensating``: each gets a NUL (``\\u0000``, which jsonb refuses), as if the check
    before the write had missed it."""
    original = instances_sql.instance_begin_compensating

    async def begin(
        conn: Executor, instance_id: str, token: str, error: dict[str, Any] | None, comps: list[dict[str, Any]]
    ) -> bool:
        comps = [{**c, "kwargs": {"booking": "\x00"}} for c in comps]
        return await original(conn, instance_id, token, error, comps)

    monkeypatch.setattr(instances_sql, "instance_begin_compensating", begin)


@pytest.mark.parametrize("cancel", [False, True])
async def test_compensations_the_database_refuses_leave_the_saga_failed_and_named(
    database: Database, sql: Sql, side_channel: str, monkeypatch: pytest.MonkeyPatch, cancel: bool
) -> None:
    """Before, the refused compensation was dropped with a warning and the saga ended as if
    undone (``cancelled`` after a cancel) although the effect it undoes had happened."""
    expect_log("instance.failed", workflow="late_compensation")
    expect_log("instance.compensations_unstorable", workflow="late_compensation")
    refuse_unsaved_compensations(monkeypatch)
    async with Client(database=database) as client, running_worker(database, saga_refusals.app):
        started = await client.start(saga_refusals.late_compensation, cancel=cancel)
        iid = started.instance_id
        if cancel:  # once it runs: a cancel before the first step has nothing to undo
            await eventually(lambda: history(sql, iid), timeout=30, message="book_now recorded")
            await client.cancel(iid)
        assert await settled(sql, iid) == "failed"
    counts = executions(side_channel)
    assert counts[f"book_now {iid}"] == 1
    assert counts[f"cancel_booking {iid}"] == 1  # b-early's; b-late's compensation was never stored
    _, error, _ = instance(sql, iid)
    assert error["type"] == "kenning.compensation.CompensationFailedError"
    assert error["message"].startswith(
        "compensation tests.apps.limits:cancel_booking (comp:2) was never run: the database refused to store it "
        "(a write cannot be stored: "
    )
    assert "; the saga is not undone (" in error["message"]
    assert ("(the instance was cancelled)" in error["message"]) == cancel
    steps = [(s, k) for s, k, _ in history(sql, iid)]
    assert steps[-1] == ("compensation:on_failure:book_now:1", "CompensationExecuted")


async def test_a_refusal_after_compensations_ran_never_runs_them_twice(
    database: Database, sql: Sql, side_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that ends the saga is refused once: the run ends there and the next one
    resumes the saga from what is stored. Before, the whole saga ran again at once, from a
    history that did not know the compensation had run."""
    expect_log("instance.failed", workflow="unstorable_result")
    expect_log("instance.run_crashed", workflow="unstorable_result")
    original = instances_sql.instance_finish
    refused: list[str] = []

    async def finish(conn: Executor, instance_id: str, token: str, status: str, error: dict[str, Any] | None) -> bool:
        if not refused:  # the first time only; a NUL in jsonb: refused by PostgreSQL itself
            refused.append(instance_id)
            error = {**(error or {}), "message": "\x00"}
        return await original(conn, instance_id, token, status, error)

    monkeypatch.setattr(instances_sql, "instance_finish", finish)
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.unstorable_result)
        assert await settled(sql, started.instance_id) == "failed"
    iid = started.instance_id
    assert refused == [iid]
    counts = executions(side_channel)
    assert counts[f"book {iid}"] == 1
    assert counts[f"cancel_booking {iid}"] == 1
    steps = [(s, k) for s, k, _ in history(sql, iid)]
    assert steps.count(("compensation:on_failure:book:1", "CompensationExecuted")) == 1
    status, error, run_count = instance(sql, iid)
    assert (status, run_count) == ("failed", 2)
    assert error["type"] == "kenning.errors.UnstorableValueError"  # the workflow's error, kept
