"""Crash loops (issue 13, item 1): an instance whose activity kills its worker process is
parked as failed with reason ``crash_loop`` after ``--max-runs`` runs, instead of taking
the worker fleet down again and again; the instances around it finish; an operator's
``kenning instances retry`` makes it runnable again."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path

import psutil
import psycopg
from sqlalchemy import text

from kenning import Client
from kenning.db import Database
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from tests.logguard import expect_log
from tests.support import ProcessPool, check_invariants, eventually, executions, kenning_command

APP = "tests.apps.poison"
MAX_RUNS = 3
BYSTANDERS = 12


async def test_an_instance_that_kills_its_worker_is_parked_and_the_others_finish(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
) -> None:
    poison_file = tmp_path / "poison"
    poison_file.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_POISON_FILE": str(poison_file)}
    options = ("--max-runs", str(MAX_RUNS), "--lease-seconds", "1", "--concurrency", "8")

    def start_worker() -> psutil.Popen:
        return processes.worker(database_url, APP, *options, env=env)

    workers = [start_worker() for _ in range(2)]
    await eventually(
        lambda: all('"worker.started"' in processes.log_of(w) for w in workers), timeout=60, message="workers up"
    )
    async with Client(database=database) as client:
        starts = [client.start("crash_looper", value=7)]
        starts += [client.start("bystander", value=n) for n in range(BYSTANDERS)]
        started = await asyncio.gather(*starts)
    poison, bystanders = started[0].instance_id, [s.instance_id for s in started[1:]]
    expect_log("instance.crash_loop", instance_id=poison)

    def settled() -> bool:
        row = sql.execute(
            "SELECT (SELECT status FROM kenning_instances WHERE id = %s),"
            " (SELECT count(*) FROM kenning_instances WHERE id = ANY(%s) AND status = 'completed')",
            (poison, bystanders),
        ).fetchone()
        return row == ("failed", BYSTANDERS)

    # a supervisor: a worker that died is replaced (ProcessPool does not restart them)
    deaths = 0
    deadline = time.monotonic() + 180
    while not settled():
        assert time.monotonic() < deadline, f"not settled after {deaths} worker deaths: {_states(sql)}"
        for i, worker in enumerate(workers):
            if worker.poll() is not None:
                deaths += 1
                workers[i] = start_worker()
        await asyncio.sleep(0.1)

    row = sql.execute(
        "SELECT status, error, run_count, runs_without_progress, lease_token, available_at"
        " FROM kenning_instances WHERE id = %s",
        (poison,),
    ).fetchone()
    assert row is not None
    status, error, run_count, runs_without_progress, lease_token, available_at = row
    assert isinstance(error, dict)
    assert (status, error["reason"], lease_token, available_at) == ("failed", "crash_loop", None, None)
    assert run_count == runs_without_progress == MAX_RUNS, row
    assert executions(side_channel)[f"explode {poison}"] == MAX_RUNS  # never handed out again
    assert 1 <= deaths <= MAX_RUNS
    logs = "".join(processes.log_of(proc) for proc, _ in processes.procs)
    assert logs.count('"instance.crash_loop"') == 1
    check_invariants(sql)

    shown = kenning_command("instances", "show", poison, url=database_url)
    assert shown.returncode == 0, shown.stderr
    assert "crash_loop" in shown.stdout and "kenning instances retry" in shown.stdout, shown.stdout
    shown_json = json.loads(kenning_command("instances", "show", poison, "--json", url=database_url).stdout)
    assert shown_json["error"]["reason"] == "crash_loop"

    # the operator fixes the cause and retries: it runs again, from where it was
    poison_file.unlink()
    retried = kenning_command("instances", "retry", poison, url=database_url)
    assert retried.returncode == 0, retried.stderr
    assert "crash-loop run counter was reset" in retried.stdout
    async with Client(database=database) as client:
        assert await client.result(poison, timeout=60) == 7
    row = sql.execute("SELECT runs_without_progress, error FROM kenning_instances WHERE id = %s", (poison,)).fetchone()
    assert row == (0, None)
    check_invariants(sql)


async def test_the_claim_counts_expired_leases_without_a_step_and_parks_at_max_runs(database: Database) -> None:
    """The claim's own accounting, with time moved: an expired lease counts unless its run
    recorded a step, one suspect is handed out per claim, and at ``max_runs`` the
    instance is parked instead of handed out; a clean release resets the count."""
    async with database.engine.begin() as conn:
        for name in ("a", "b"):
            await instances_sql.instance_insert(
                conn, instance_id=name, workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
            )
        now = (await conn.execute(text("SELECT now() AS now"))).scalar_one()

    async def claim(seconds: float) -> instances_sql.Claim:
        async with database.autocommit.connect() as conn:
            return await instances_sql.instance_claim(
                conn,
                owner="w",
                workflow_names=["wf"],
                limit=10,
                lease_seconds=1,
                max_runs=2,
                now=now + timedelta(seconds=seconds),
            )

    first = await claim(0)
    assert sorted((c.id, c.suspect) for c in first.instances) == [("a", False), ("b", False)]
    # both runs die (their leases expire): one suspect per claim, each run counted
    second, third = await claim(5), await claim(5)
    assert [(c.id, c.suspect) for c in second.instances + third.instances] == [("a", True), ("b", True)]
    b = third.instances[0]
    async with database.autocommit.connect() as raw:
        recorded = await history_sql.history_record_step(
            raw,
            instance_id="b",
            token=b.lease_token,
            step_id="s:1",
            kind="ActivityCompleted",
            step_name="s",
            payload={},
        )
    assert recorded is not None
    # both die again: a's second run in a row without a step parks it; b made progress
    fourth, fifth = await claim(10), await claim(10)
    assert [p.id for p in fourth.parked] == ["a"] and fourth.instances == []
    assert [(c.id, c.suspect) for c in fifth.instances] == [("b", True)] and fifth.parked == []
    counts = await _counts(database)
    assert counts == {"a": ("failed", 2, 2), "b": ("running", 0, 3)}
    # a clean end (release) is no run to count
    async with database.autocommit.connect() as raw:
        assert await instances_sql.instance_release(raw, "b", fifth.instances[0].lease_token)
    sixth = await claim(20)
    assert [(c.id, c.suspect) for c in sixth.instances] == [("b", False)]
    # the operator's retry makes a runnable again, its count reset
    async with database.engine.begin() as conn:
        assert (await instances_sql.instance_retry(conn, "a"))["retried"]
    assert (await _counts(database))["a"] == ("pending", 0, 2)


async def _counts(database: Database) -> dict[str, tuple[str, int, int]]:
    async with database.autocommit.connect() as conn:
        rows = await conn.execute(
            text("SELECT id, status, runs_without_progress, run_count FROM kenning_instances ORDER BY id")
        )
        return {row.id: (row.status, row.runs_without_progress, row.run_count) for row in rows}


def _states(sql: psycopg.Connection[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT workflow_name, status, run_count, runs_without_progress FROM kenning_instances ORDER BY created_at"
    ).fetchall()
