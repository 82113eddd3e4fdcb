"""Takeovers through real workers (issue 25, items 2 and 3): the instances of a worker
killed with kill -9 are taken over together, not one at a time, and one hung activity
(no timeout, the default) holds up no other instance's recovery, even when every one of
them is a suspect (an earlier run died without recording a step)."""

from __future__ import annotations

import asyncio
import json

import psutil
import psycopg

from kenning import Client
from kenning.db import Database
from tests.support import ProcessPool, check_invariants, eventually, executions, kenning_command, workers_started

APP = "tests.apps.takeover"
LEASE = ("--lease-seconds", "3")  # a heartbeat a second; a takeover 3 s after a kill


def _statuses(sql: psycopg.Connection[tuple[object, ...]], ids: list[str]) -> dict[str, str]:
    rows = sql.execute("SELECT id, status FROM kenning_instances WHERE id = ANY(%s)", (ids,)).fetchall()
    return {str(i): str(s) for i, s in rows}


def _runs(side_channel: str, label: str, ids: list[str]) -> list[int]:
    counts = executions(side_channel)
    return [counts[f"{label} {i}"] for i in ids]


async def test_a_killed_workers_instances_are_taken_over_together(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    doomed = processes.worker(database_url, APP, *LEASE, env=env)
    await workers_started(processes, [doomed])
    async with Client(database=database) as client:
        started = await asyncio.gather(*(client.start("timed", seconds=8.0) for _ in range(10)))
    ids = [s.instance_id for s in started]
    await eventually(lambda: _runs(side_channel, "work", ids) == [1] * 10, message="all ten in flight")
    survivor = processes.worker(database_url, APP, *LEASE, env=env)
    await workers_started(processes, [survivor])
    doomed.kill()
    doomed.wait(timeout=10)
    # Taken over together: every instance's activity runs a second time while none of
    # those 8 s runs has ended. One at a time, the second would start only after the first
    # ended (or its own lease passed).
    await eventually(lambda: _runs(side_channel, "work", ids) == [2] * 10, timeout=30, message="all taken over")
    assert set(_statuses(sql, ids).values()) == {"running"}, _statuses(sql, ids)
    await eventually(lambda: set(_statuses(sql, ids).values()) == {"completed"}, timeout=60, message="all done")
    check_invariants(sql)


async def test_a_hung_suspect_holds_up_no_other_recovery(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    first = processes.worker(database_url, APP, *LEASE, env=env)
    await workers_started(processes, [first])
    async with Client(database=database) as client:
        # ids in claim order: the hung one is the first suspect any claim offers
        await client.start("hung", instance_id="a-hung")
        await eventually(lambda: executions(side_channel)["hang a-hung"] == 1, message="the hang runs")
        timed = [f"b-{n}" for n in range(5)]
        await asyncio.gather(*(client.start("timed", instance_id=i, seconds=4.0) for i in timed))
    everyone = ["a-hung", *timed]
    await eventually(lambda: _runs(side_channel, "work", timed) == [1] * 5, message="all in flight")
    first.kill()
    first.wait(timeout=10)
    # a second worker takes them all over and dies too before any records a step: now
    # every one of them is a suspect (runs_without_progress 1)
    second = processes.worker(database_url, APP, *LEASE, env=env)
    await eventually(lambda: _runs(side_channel, "work", timed) == [2] * 5, timeout=30, message="taken over")
    await eventually(lambda: executions(side_channel)["hang a-hung"] == 2, message="the hang taken over")
    second.kill()
    second.wait(timeout=10)

    def suspects() -> int:
        row = sql.execute(
            "SELECT count(*) FROM kenning_instances WHERE id = ANY(%s) AND runs_without_progress = 1"
            " AND available_at <= now()",
            (everyone,),
        ).fetchone()
        return int(str(row[0])) if row else 0

    # every lease expires (3 s after the kill); no worker is running now
    await eventually(lambda: suspects() == 6, timeout=30, message="six suspects due")
    why = kenning_command("why", "b-0", "--json", url=database_url)
    assert why.returncode == 0, why.stderr
    assert "isolated" in json.loads(why.stdout)["way_forward"], why.stdout
    third = processes.worker(database_url, APP, *LEASE, env=env)
    await workers_started(processes, [third])
    # the hung one is taken first and never ends; the others recover all the same
    await eventually(
        lambda: {_statuses(sql, timed)[i] for i in timed} == {"completed"}, timeout=90, message="the five done"
    )
    assert _statuses(sql, ["a-hung"]) == {"a-hung": "running"}
    assert isinstance(third, psutil.Popen) and third.poll() is None
