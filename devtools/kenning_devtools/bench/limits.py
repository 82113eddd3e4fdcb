"""The limits every benchmark result is divided by, measured on the same database:
``pgbench -N``, a bare single-row insert loop, and the bare engine (Kenning's own claim,
step and completion SQL driven by plain psycopg, with nothing else around it)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time

import psycopg
from psycopg.rows import dict_row

from kenning.core.names import ACTIVITY_COMPLETED
from kenning.hosting.embedded import with_database
from kenning.storage import claims as claims_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql

CLAIM = claims_sql._INSTANCE_CLAIM.sql
RECORD = history_sql._HISTORY_RECORD_STEP.sql
COMPLETE = instances_sql._INSTANCE_COMPLETE.sql


def pgbench_tps(url: str, clients: int, seconds: float) -> float | None:
    """``pgbench -N`` (simple update) TPS, or None where pgbench is not installed."""
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    subprocess.run([binary, "-i", "-q", "-s", "1", url], check=True, capture_output=True, timeout=300)
    out = subprocess.run(
        [binary, "-N", "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(max(1, round(seconds))), url],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    match = re.search(r"tps = ([\d.]+)", out)
    return float(match.group(1)) if match else None


async def insert_loop_rate(url: str, clients: int, seconds: float) -> float:
    """Single-row inserts per second, each its own commit, ``clients`` at once."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS bench_insert")
        await conn.execute("CREATE TABLE bench_insert (id bigserial PRIMARY KEY, payload text NOT NULL)")
    deadline = time.monotonic() + seconds
    counts = [0] * clients

    async def loop(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                await conn.execute("INSERT INTO bench_insert (payload) VALUES (%s)", ("x" * 32,))
                counts[i] += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    return sum(counts) / (time.monotonic() - started)


def _bump_step(n: int, result: int) -> str:
    """The JSON of one recorded ``bump`` activity, as the step statements take it."""
    return json.dumps(
        [{"step_id": f"bump:{n}", "kind": ACTIVITY_COMPLETED, "step_name": "bump", "payload": {"result": result}}]
    )


async def bare_engine_rate(url: str, clients: int, workflows: int, batch: int = 10) -> dict[str, float]:
    """Three-step workflows through Kenning's SQL alone: batched claim with a lease token,
    one fenced round trip per step, the last folded into the fenced completion."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DELETE FROM kenning_instances WHERE workflow_name = 'bench_bare'")
        await conn.execute(
            "INSERT INTO kenning_instances (id, workflow_name, available_at) "
            "SELECT 'bare-' || g, 'bench_bare', now() FROM generate_series(1, %s) g",
            (workflows,),
        )
        before = await commits(conn)

    async def loop(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) as conn:
            while True:
                cur = await conn.execute(
                    CLAIM,
                    {
                        "owner": f"bare-{i}",
                        "names": ["bench_bare"],
                        "limit": batch,
                        "lease_seconds": 30.0,
                        "now": None,
                        "code_version": None,
                        "pinned": [],
                    },
                )
                claimed = [row for row in await cur.fetchall() if row["id"] is not None]  # not the "next" row
                if not claimed:
                    return
                for row in claimed:
                    instance_id, token = row["id"], row["lease_token"]
                    for n in (1, 2):
                        await conn.execute(
                            RECORD,
                            {
                                "id": instance_id,
                                "token": token,
                                "steps": _bump_step(n, 1),
                                "compensations": "[]",
                            },
                        )
                    await conn.execute(
                        COMPLETE,
                        {
                            "id": instance_id,
                            "token": token,
                            "result": '{"result": 3}',
                            "pending_step": _bump_step(3, 3),
                            "compensations": "[]",
                        },
                    )

    started = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    elapsed = time.monotonic() - started
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        after = await commits_when_alone(url, conn)
        done = await (
            await conn.execute(
                "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'bench_bare' AND status = 'completed'"
            )
        ).fetchone()
    assert done is not None and done[0] == workflows, f"bare engine completed {done} of {workflows}"
    return {"workflows_per_second": workflows / elapsed, "commits_per_workflow": (after - before) / workflows}


async def commits(conn: psycopg.AsyncConnection[tuple[object, ...]], settle: bool = False) -> int:
    """Committed transactions of this database so far (``pg_stat_database``)."""
    if settle:
        await asyncio.sleep(1.2)  # backends flush their counters about once a second
    cur = await conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    row = await cur.fetchone()
    assert row is not None
    return int(str(row[0]))


async def commits_when_alone(url: str, conn: psycopg.AsyncConnection[tuple[object, ...]], timeout: float = 10.0) -> int:
    """``commits(conn)`` once no other session is connected to ``conn``'s database, for a
    count after the measured processes ended: a backend flushes its counters as it exits,
    before it leaves ``pg_stat_activity`` (PostgreSQL 15+), so this is the settled count
    without a fixed wait. Watched from the ``postgres`` database, so the watching commits
    nothing here; the statistics collector before 15 had no such order: a fixed wait there."""
    if conn.info.server_version < 150000:
        return await commits(conn, settle=True)
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(with_database(url, "postgres"), autocommit=True) as watch:
        while time.monotonic() < deadline:
            cur = await watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s "
                "AND backend_type = 'client backend'",
                (conn.info.dbname, conn.info.backend_pid),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.01)
    return await commits(conn)
