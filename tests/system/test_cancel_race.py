"""A cancel that lands while a workflow runs its last activity (issue 25, item 4): Edda
0.1.0 re-checks cancellation after every activity, so the cancel must win over the
completion it raced: the instance ends ``cancelled`` and the activity's compensation
runs. A cancel after the completion committed is answered as too late."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg

from kenning import Client
from kenning.db import Database
from tests.support import ProcessPool, check_invariants, eventually, executions, kenning_command, workers_started

APP = "tests.apps.takeover"


async def test_a_cancel_during_the_last_activity_compensates_it(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    worker = processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        started = await client.start("book_last", item="seat", release_file=str(release))
        instance = started.instance_id
        await eventually(lambda: executions(side_channel)[f"book {instance}"] == 1, message="booking runs")
        cancelled = kenning_command("instances", "cancel", instance, url=database_url)
        assert (cancelled.returncode, cancelled.stdout.strip()) == (0, f"{instance}: cancellation requested")
        release.touch()  # the last activity returns now, after the cancel committed
        await eventually(
            lambda: (
                sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
                == ("cancelled",)
            ),
            message="the instance cancelled",
        )
    counts = executions(side_channel)
    assert (counts[f"book {instance}"], counts[f"unbook {instance}"]) == (1, 1)
    kinds = [
        row[0]
        for row in sql.execute(
            "SELECT kind FROM kenning_history WHERE instance_id = %s ORDER BY created_at", (instance,)
        )
    ]
    assert kinds == ["ActivityCompleted", "CompensationExecuted"], kinds
    check_invariants(sql)


async def test_a_cancel_after_the_completion_is_answered_too_late(
    database: Database, database_url: str, processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    release.touch()
    worker = processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        started = await client.start("book_last", item="seat", release_file=str(release))
        assert await client.result(started.instance_id, timeout=30) == "seat"
    late = kenning_command("instances", "cancel", started.instance_id, url=database_url)
    assert late.returncode == 1
    assert late.stdout.strip() == f"{started.instance_id}: too late to cancel: it already ended completed"
    shown = json.loads(kenning_command("instances", "cancel", started.instance_id, "--json", url=database_url).stdout)
    assert shown == {"instance_id": started.instance_id, "cancel_requested": False, "status": "completed"}
    assert executions(side_channel)[f"unbook {started.instance_id}"] == 0
    await asyncio.sleep(0)


async def test_a_cancel_while_waiting_runs_each_compensation_once(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    """Compensations registered without an id are numbered by their order in the run. A
    cancel loads the saved ones before the body replays, and the replay registered them
    again under new numbers (comp:3, comp:4), so each ran twice."""
    worker = processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        started = await client.start("listed_then_waits", order_id="o-9")
        instance = started.instance_id
        await eventually(
            lambda: (
                sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
                == ("waiting_for_event",)
            ),
            message="it waits",
        )
        assert await client.cancel(instance)
        await eventually(
            lambda: (
                sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
                == ("cancelled",)
            ),
            message="cancelled",
        )
    counts = executions(side_channel)
    assert (counts[f"unlist:first {instance}"], counts[f"unlist:second {instance}"]) == (1, 1), counts
    saved = sql.execute(
        "SELECT comp_id FROM kenning_compensations WHERE instance_id = %s ORDER BY position", (instance,)
    )
    assert [row[0] for row in saved] == ["comp:1", "comp:2"]
    check_invariants(sql)
