"""Group-committed worker writes against a real PostgreSQL: one statement carries the
step records and completions of many instances, each fenced by its own lease."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
from sqlalchemy import text

from kenning import Client
from kenning.db import Database
from kenning.storage.writes import InstanceWrite, writes_apply
from tests.apps import core
from tests.support import running_worker

Sql = psycopg.Connection[tuple[object, ...]]


def step(step_id: str, result: int) -> dict[str, object]:
    return {"step_id": step_id, "kind": "ActivityCompleted", "step_name": "a", "payload": {"result": result}}


async def test_each_write_is_fenced_by_its_own_lease(database: Database, sql: Sql) -> None:
    held, cancelled = str(uuid.uuid4()), str(uuid.uuid4())
    async with database.autocommit.connect() as conn:
        await conn.execute(
            text(
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
