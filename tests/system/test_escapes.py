"""The operator's escape hatches and bulk actions through a real worker process and the
real ``kenning`` command: terminate a saga whose compensation fails for ever, skip that
compensation instead, cancel by filter with a dry run first, and the action log of it all."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests.apps import escapes
from tests.console_support import became, instance_status
from tests.support import ProcessPool, eventually, executions
from tests.support import kenning_command as kenning

APP = "tests.apps.escapes"


def _actions(url: str, target: str | None = None) -> list[dict[str, Any]]:
    args = ["actions", "list", "--json"] + (["--target", target] if target else [])
    listed = kenning(*args, url=url)
    assert listed.returncode == 0, listed.stderr
    return list(reversed(json.loads(listed.stdout)))  # oldest first


async def _compensating_for_ever(
    client: Client, sql: psycopg.Connection[tuple[object, ...]], url: str, side_channel: str, order: str
) -> str:
    """A stuck saga cancelled: its refund fails again and again, the instance stays compensating."""
    started = await client.start(escapes.stuck_saga, order=order)
    instance_id = started.instance_id
    await became(sql, instance_id, "waiting_for_event")
    cancelled = kenning("instances", "cancel", instance_id, url=url)
    assert cancelled.returncode == 0 and "cancellation requested" in cancelled.stdout, cancelled.stderr
    await eventually(lambda: executions(side_channel)[f"refund {instance_id}"] >= 3, timeout=20)
    assert instance_status(sql, instance_id) == "compensating"
    return instance_id


async def test_terminate_ends_a_saga_whose_compensation_fails_for_ever(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: psycopg.Connection[tuple[object, ...]],
    side_channel: str,
) -> None:
    processes.worker(database_url, APP)
    async with Client(database=database) as client:
        instance_id = await _compensating_for_ever(client, sql, database_url, side_channel, "o1")
        # a second cancel changes nothing, and says so instead of "cancellation requested"
        again = kenning("instances", "cancel", instance_id, url=database_url)
        assert again.returncode == 1 and "already being cancelled" in again.stdout, again.stdout
        assert "terminate" in again.stdout

        missing = kenning("instances", "terminate", instance_id, url=database_url)
        assert missing.returncode == 2 and "--reason" in missing.stderr

        ended = kenning("instances", "terminate", instance_id, "--reason", "the bank is down", url=database_url)
        assert ended.returncode == 0 and f"{instance_id}: terminated" in ended.stdout, ended.stdout + ended.stderr
        assert instance_status(sql, instance_id) == "failed"
        with pytest.raises(WorkflowFailedError, match="terminated by an operator: the bank is down"):
            await client.result(instance_id, timeout=10)
    row = sql.execute("SELECT error FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
    assert row is not None
    error: dict[str, Any] = row[0]  # type: ignore[assignment]
    assert error["reason"] == "terminated" and error["terminated_status"] == "compensating"
    # the worker stops at its next fenced write: no refund runs past a short settling
    settled = executions(side_channel)[f"refund {instance_id}"]
    await eventually(lambda: executions(side_channel)[f"refund {instance_id}"] <= settled + 1, timeout=5)
    assert executions(side_channel)[f"release {instance_id}"] == 0  # nothing compensated after the terminate
    # ended: terminate and retry are refused, with the reason
    twice = kenning("instances", "terminate", instance_id, "--reason", "again", url=database_url)
    assert twice.returncode == 1 and ": it already ended failed" in twice.stdout
    retried = kenning("instances", "retry", instance_id, url=database_url)
    assert retried.returncode == 1 and "terminated by an operator" in retried.stdout

    log = _actions(database_url, instance_id)
    assert [(a["action"], a["affected"]) for a in log] == [
        ("cancel", 1),
        ("cancel", 0),
        ("terminate", 1),
        ("terminate", 0),
        ("retry", 0),
    ]
    assert {a["origin"] for a in log} == {"cli"} and all("@" in a["actor"] for a in log)
    assert log[2]["reason"] == "the bank is down"
    shown = kenning("instances", "show", instance_id, url=database_url).stdout
    assert "terminated by an operator: the bank is down" in shown


async def test_skipping_the_failing_compensation_lets_the_saga_end(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: psycopg.Connection[tuple[object, ...]],
    side_channel: str,
) -> None:
    processes.worker(database_url, APP)
    async with Client(database=database) as client:
        instance_id = await _compensating_for_ever(client, sql, database_url, side_channel, "o2")
        skipped = kenning(
            "instances", "skip-compensation", instance_id, "--reason", "refunded by hand", url=database_url
        )
        assert skipped.returncode == 0, skipped.stdout + skipped.stderr
        assert "skipped; the saga goes on past it" in skipped.stdout
        # the next compensation runs, and the cancel ends as a cancel
        with pytest.raises(WorkflowFailedError, match="cancelled"):
            await client.result(instance_id, timeout=20)
    assert instance_status(sql, instance_id) == "cancelled"
    assert executions(side_channel)[f"release {instance_id}"] == 1
    kinds = sql.execute(
        "SELECT kind FROM kenning_history WHERE instance_id = %s AND step_id LIKE 'compensation:%%' ORDER BY kind",
        [instance_id],
    ).fetchall()
    assert [k[0] for k in kinds] == ["CompensationExecuted", "CompensationSkipped"]
    shown = kenning("instances", "show", instance_id, url=database_url).stdout
    assert "skipped by an operator: refunded by hand" in shown
    none_left = kenning("instances", "skip-compensation", instance_id, "--reason", "x", url=database_url)
    assert none_left.returncode == 1 and ": it is cancelled: only a saga" in none_left.stdout
    assert [a["action"] for a in _actions(database_url, instance_id)] == [
        "cancel",
        "skip-compensation",
        "skip-compensation",
    ]


async def test_bulk_cancel_counts_first_then_cancels_in_batches(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: psycopg.Connection[tuple[object, ...]],
) -> None:
    processes.worker(database_url, APP)
    async with Client(database=database) as client:
        waiters = [(await client.start(escapes.waiter, n=n)).instance_id for n in range(5)]
        other = (await client.start(escapes.stuck_saga, order="o3")).instance_id
        for instance_id in [*waiters, other]:
            await became(sql, instance_id, "waiting_for_event")
        selected = ("--workflow", "escapes.waiter", "--status", "waiting_for_event")
        dry = kenning("instances", "cancel", *selected, "--dry-run", url=database_url)
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.startswith("5 instance(s) match"), dry.stdout
        assert {instance_status(sql, i) for i in waiters} == {"waiting_for_event"}
        assert _actions(database_url) == []  # a dry run changes nothing and is not an action

        done = kenning("instances", "cancel", *selected, "--batch-size", "2", "--json", url=database_url)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["matched"], result["affected"], result["batches"]) == (5, 5, 3)
        for instance_id in waiters:
            with pytest.raises(WorkflowFailedError, match="cancelled"):
                await client.result(instance_id, timeout=20)
        assert instance_status(sql, other) == "waiting_for_event"  # another workflow: not selected
        # nothing left to select: a second run finds none
        again = kenning("instances", "cancel", *selected, url=database_url)
        assert again.returncode == 0 and again.stdout.startswith("0 of 0"), again.stdout

    (first, second) = _actions(database_url)
    assert first["action"] == "cancel" and first["target"] is None and first["affected"] == 5
    assert first["filter"] == {
        "statuses": ["waiting_for_event"],
        "workflow": "escapes.waiter",
        "not_cancel_requested": True,
    }
    assert second["affected"] == 0


def test_bulk_actions_refuse_what_they_never_apply_to(database_url: str) -> None:
    wrong = kenning("instances", "retry", "--status", "completed", url=database_url)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == "kenning instances: retry never applies to completed instances: choose among failed"
    unnamed = kenning("instances", "terminate", "--reason", "x", url=database_url)
    assert unnamed.returncode == 2 and "name the instances to terminate" in unnamed.stderr
    both = kenning("instances", "cancel", "some-id", "--workflow", "w", url=database_url)
    assert both.returncode == 2 and "not both" in both.stderr
    bad_time = kenning("instances", "cancel", "--created-before", "yesterday", url=database_url)
    assert bad_time.returncode == 2 and "is not a time" in bad_time.stderr
