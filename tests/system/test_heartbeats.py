"""Activity heartbeats through real worker processes (issue 29, item 5): an attempt that
stops heartbeating fails by its heartbeat timeout long before its lease would tell, and
the next attempt, on the same worker or on another after a kill -9, resumes from the
details the last one heartbeated.

Before the feature, ``@activity(heartbeat_timeout=...)`` and ``ctx.heartbeat`` did not
exist: the app of these tests failed to import in the worker and every test here failed.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.support import ProcessPool, check_invariants, eventually, executions, workers_started

APP = "tests.apps.heartbeats"
Sql = psycopg.Connection[tuple[object, ...]]


def _timed_out_lines(log: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "activity.heartbeat_timed_out"]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_attempt_that_stops_heartbeating_fails_early_and_the_next_resumes(
    database: Database, database_url: str, processes: ProcessPool, side_channel: str, kind: str
) -> None:
    # a lease of 60 s: only the heartbeat timeout (0.5 s) can end the stuck attempt in time
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    worker = processes.worker(database_url, APP, "--lease-seconds", "60", env=env)
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        began = time.monotonic()
        started = await client.start("heartbeat_import", rows=10, hang_at=4, kind=kind)
        result = await client.result(started.instance_id, timeout=20)
        took = time.monotonic() - began
    # the second attempt started where the first one's last heartbeat said: 4 rows done
    assert result == {"resumed_from": 4, "rows": 10}
    name = "import_rows" if kind == "async" else "import_rows_sync"
    assert executions(side_channel)[f"{name} {started.instance_id}"] == 2
    assert took < 10, f"{took:.1f} s: the lease (60 s) would have told, not the heartbeat"
    timed_out = _timed_out_lines(processes.log_of(worker))
    assert [(line["step"], line["attempt"], line["level"]) for line in timed_out] == [(f"{name}:1", 1, "warning")]
    assert "sent no heartbeat for 0.5 s" in str(timed_out[0]["error"])


async def test_the_details_survive_a_worker_killed_mid_attempt(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    doomed = processes.worker(database_url, APP, "--lease-seconds", "3", env=env)
    await workers_started(processes, [doomed])
    async with Client(database=database) as client:
        started = await client.start("heartbeat_import", rows=6, hang_at=3, kind="checkpointed")
        iid = started.instance_id

        def checkpoint() -> object:
            row = sql.execute(
                "SELECT attempts -> 'checkpointed:1' -> 'heartbeat_details' FROM kenning_instances WHERE id = %s",
                (iid,),
            ).fetchone()
            return None if row is None else row[0]

        # the first heartbeat is written at once, the later ones within the write interval
        await eventually(lambda: checkpoint() == 3, timeout=15, message="the third heartbeat written")
        doomed.kill()
        doomed.wait(timeout=10)
        survivor = processes.worker(database_url, APP, "--lease-seconds", "3", env=env)
        await workers_started(processes, [survivor])
        result = await client.result(iid, timeout=30)
    assert result == {"resumed_from": 3, "rows": 6}
    assert executions(side_channel)[f"checkpointed {iid}"] == 2
    # the step's record cleared its entry: no heartbeat details outlive the step
    assert sql.execute("SELECT attempts FROM kenning_instances WHERE id = %s", (iid,)).fetchone() == ({},)
    check_invariants(sql)
