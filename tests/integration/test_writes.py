"""Group-committed worker writes against a real PostgreSQL: one statement carries the
step records and completions of many instances, each fenced by its own lease."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import psycopg
import pytest

from kenning import Client
from kenning.db import Database, connect, statement
from kenning.storage.writes import InstanceWrite, writes_apply
from tests.apps import core
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


def step(step_id: str, result: int) -> dict[str, object]:
    return {"step_id": step_id, "kind": "ActivityCompleted", "step_name": "a", "payload": {"result": result}}


async def test_each_write_is_fenced_by_its_own_lease(database: Database, sql: Sql) -> None:
    held, cancelled = str(uuid.uuid4()), str(uuid.uuid4())
    async with database.connection() as conn:
        await conn.execute(
            statement(
                "INSERT INTO kenning_instances (id, workflow_name, status, lease_token, cancel_requested) VALUES "
                "('w-1', 'w', 'running', CAST(:held AS uuid), false), "
                "('w-2', 'w', 'running', CAST(:cancelled AS uuid), true)"
            ),
            {"held": held, "cancelled": cancelled},
        )
        compensation = {
            "comp_id": "undo:1",
            "position": 0,
            "function_name": "undo",
            "args": [],
            "kwargs": {},
            "retry_policy": None,
        }
        flags = await writes_apply(
            conn,
            [
                InstanceWrite("w-1", held, steps=[step("a:1", 1)], compensations=[compensation]),
                InstanceWrite("w-1", str(uuid.uuid4()), steps=[step("stale:1", 9)]),  # a stale token: nothing
                InstanceWrite("w-2", cancelled, steps=[step("a:1", 2)]),
                InstanceWrite("gone", held, steps=[step("a:1", 3)]),  # no such instance: nothing
                InstanceWrite("w-1", held, steps=[step("a:2", 4)], complete=True, result={"result": 4}),
            ],
        )
    assert flags == [False, None, True, None, False]  # the cancel flag, or None: lease lost
    history = sql.execute("SELECT instance_id, step_id FROM kenning_history ORDER BY seq").fetchall()
    assert history == [("w-1", "a:1"), ("w-2", "a:1"), ("w-1", "a:2")]
    assert sql.execute("SELECT instance_id, comp_id FROM kenning_compensations").fetchall() == [("w-1", "undo:1")]
    rows = sql.execute("SELECT id, status, result, lease_token FROM kenning_instances ORDER BY id").fetchall()
    assert rows == [("w-1", "completed", {"result": 4}, None), ("w-2", "running", None, uuid.UUID(cancelled))]


async def test_instances_running_side_by_side_share_write_statements(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client:
        started = [await client.start(core.three_steps, value=n) for n in range(40)]
        async with running_worker(database, core.app, concurrency=40) as worker:
            results = await asyncio.gather(*(client.result(s.instance_id, timeout=30) for s in started))
            writes = worker.writes
    assert results == [(n + 1) * 2 - 3 for n in range(40)]
    # two step records and one completion per instance, in far fewer statements
    assert writes.items == 3 * 40
    assert writes.statements < writes.items / 2, (writes.statements, writes.items)
    per_instance = sql.execute("SELECT instance_id, count(*) FROM kenning_history GROUP BY 1").fetchall()
    assert len(per_instance) == 40 and {n for _, n in per_instance} == {3}


async def test_concurrent_starts_share_statements_and_keep_idempotency(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client:
        await client.start(core.three_steps, value=0)  # stores the definition first
        started = await asyncio.gather(
            *(client.start(core.three_steps, value=n, idempotency_key=f"k{n % 10}") for n in range(30))
        )
        assert client.starts.statements < 30 and client.starts.items == 31
    # one instance per key: the first start of each key created it, the others got it back
    by_key: dict[str, set[str]] = {}
    for n, s in enumerate(started):
        by_key.setdefault(f"k{n % 10}", set()).add(s.instance_id)
    assert all(len(ids) == 1 for ids in by_key.values())
    assert [s.created for s in started] == [True] * 10 + [False] * 20
    keyed = sql.execute("SELECT count(*) FROM kenning_instances WHERE idempotency_key IS NOT NULL").fetchone()
    assert keyed == (10,)


async def test_two_starts_of_one_explicit_id_in_a_batch_create_it_once(database: Database) -> None:
    async with Client(database=database) as client:
        await client.start(core.three_steps, value=0)
        both = await asyncio.gather(*(client.start(core.three_steps, instance_id="same-id", value=n) for n in (1, 2)))
    assert sorted(s.created for s in both) == [False, True]
    assert {s.instance_id for s in both} == {"same-id"}


async def test_a_lost_connection_during_a_step_write_is_not_the_workflows_failure(
    database: Database, database_url: str, sql: Sql, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's connections die between two steps (a server restart, a failover): the
    write that meets a dead connection ends the run without failing or compensating the
    instance, and it is replayed to the end on fresh connections."""
    block = tmp_path / "block"
    block.touch()
    monkeypatch.setenv("KENNING_TEST_BLOCK_FILE", str(block))
    separator = "&" if "?" in database_url else "?"
    worker_db = connect(f"{database_url}{separator}application_name=outage-worker")
    try:
        async with Client(database=database) as client:
            started = await client.start(core.three_steps, value=4)
            async with running_worker(worker_db, core.app, lease_seconds=2.0):

                def step_one_recorded() -> bool:
                    rows = sql.execute(
                        "SELECT count(*) FROM kenning_history WHERE instance_id = %s", (started.instance_id,)
                    )
                    return rows.fetchone() == (1,)

                await eventually(step_one_recorded, timeout=10)  # step_two is running, blocked
                sql.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'outage-worker'"
                )
                block.unlink()  # step_two returns; its record meets a dead connection
                assert await client.result(started.instance_id, timeout=30) == (4 + 1) * 2 - 3
    finally:
        await worker_db.dispose()
    assert sql.execute("SELECT count(*) FROM kenning_compensations").fetchone() == (0,)
    kinds = sql.execute("SELECT kind FROM kenning_history WHERE instance_id = %s", (started.instance_id,)).fetchall()
    assert kinds == [("ActivityCompleted",)] * 3
