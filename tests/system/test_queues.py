"""Queues with limits through real worker processes (issue 19, part 3): a queue of
concurrency 3 over two workers, one killed mid-run, never runs a fourth; a rate limit of
10 per second holds in every one-second window; one partition's 10,000 queued instances do
not hold back another partition's one; a paused queue is not claimed until resumed; the
operator's ``kenning queues`` commands."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from pathlib import Path

import psutil
import psycopg
import pytest

import tests.apps.queues as queues_app
from kenning import Client, ConfigurationError, WorkflowContext, workflow
from kenning.core.records import NewInstance
from kenning.db import Database
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import progress as progress_sql
from kenning.storage import queues as queues_sql
from tests.invariants import queue_concurrency, queue_rate
from tests.support import (
    ProcessPool,
    check_invariants,
    eventually,
    executions,
    kenning_command,
    running_worker,
    workers_started,
)

APP = "tests.apps.queues"
Sql = psycopg.Connection[tuple[object, ...]]
WORKER_OPTIONS = ("--lease-seconds", "2", "--concurrency", "8")


def _workers(processes: ProcessPool, database_url: str, side_channel: str, count: int) -> list[psutil.Popen]:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    return [processes.worker(database_url, APP, *WORKER_OPTIONS, env=env) for _ in range(count)]


def _count(sql: Sql, query: str, *params: object) -> int:
    row = sql.execute(query, params).fetchone()
    assert row is not None
    return int(float(str(row[0])))


async def test_concurrency_and_rate_limits_hold_across_two_workers_one_killed(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    workers = _workers(processes, database_url, side_channel, 2)
    await workers_started(processes, workers)
    async with Client(database=database) as client:
        pays = [(await client.start(queues_app.pay, n=n, seconds=0.3)).instance_id for n in range(12)]
        rated = [(await client.start(queues_app.rated, n=n)).instance_id for n in range(30)]
        # a workflow of no queue, started into one: the start's queue= wins
        moved = (await client.start(queues_app.anywhere, n=7, queue="test-payments")).instance_id
        # kill -9 a worker while it holds instances of the limited queue: their slots free
        # only when their leases expire, and the other worker never runs a fourth meanwhile
        await eventually(
            lambda: (
                _count(
                    sql,
                    "SELECT count(*) FROM kenning_instances WHERE lease_owner IS NOT NULL "
                    "AND queue_name = 'test-payments'",
                )
                >= 2
            ),
            timeout=30,
            message="payments running",
        )
        killed = {workers[0].pid: time.time()}
        workers[0].kill()
        workers[0].wait(timeout=10)
        results = await asyncio.wait_for(asyncio.gather(*(client.result(i) for i in [*pays, *rated, moved])), 60)
    assert results == [*range(12), *range(30), 7]
    assert _count(sql, "SELECT count(*) FROM kenning_instances WHERE id = %s AND queue_name = 'test-payments'", moved)
    with open(side_channel) as fh:
        peaks = queue_concurrency(fh.read().splitlines(), {"test-payments": 3}, killed)
    assert peaks["test-payments"] == 3  # the limit was reached, so it was what held them back
    assert queue_rate(sql, "test-rated", 10, 1.0) == 10
    spread = _count(  # 30 starts at 10 a second take two seconds at least (in ms)
        sql,
        "SELECT extract(epoch FROM max(started_at) - min(started_at)) * 1000 FROM kenning_instances "
        "WHERE queue_name = 'test-rated'",
    )
    assert spread >= 1900, spread
    check_invariants(sql)


async def test_one_partitions_backlog_does_not_hold_back_another_partition(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    # 10,000 instances of partition "big", queued before anything else, in one statement
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, queue_name, "
        "partition_key) SELECT 'big-' || g, 'tenant_job', %s, jsonb_build_object('n', g), "
        "now() - interval '1 minute', 'test-fair', 'big' FROM generate_series(1, 10000) AS g",
        (queues_app.tenant_job.source_hash,),
    )
    workers = _workers(processes, database_url, side_channel, 1)
    await workers_started(processes, workers)
    async with Client(database=database) as client:
        await eventually(
            lambda: (
                _count(sql, "SELECT count(*) FROM kenning_instances WHERE id LIKE 'big-%%' AND status = 'completed'")
                >= 10
            ),
            timeout=30,
            message="the big partition running",
        )
        small = (await client.start(queues_app.tenant_job, n=-1, partition_key="small")).instance_id
        assert await asyncio.wait_for(client.result(small), 30) == -1
    # its partition's turn came in the next claims: while it waited, the big partition got
    # at most a few claims' worth of slots (concurrency 2, claims in flight as it was
    # inserted); a FIFO claim would have run the thousands queued before it first
    overtaken = _count(
        sql,
        "SELECT count(*) FROM kenning_instances AS b, kenning_instances AS s WHERE s.id = %s "
        "AND b.id LIKE 'big-%%' AND b.started_at > s.created_at AND b.started_at < s.started_at",
        small,
    )
    assert overtaken <= 6, overtaken
    waited = sql.execute(
        "SELECT extract(epoch FROM started_at - created_at) FROM kenning_instances WHERE id = %s", (small,)
    ).fetchone()
    assert waited is not None
    print(f"the small partition's instance started {float(str(waited[0])):.3f} s after its start")
    read_at = time.time()  # the worker still runs the big partition: its current runs have no end yet
    with open(side_channel) as fh:
        queue_concurrency(fh.read().splitlines(), {"test-fair": 2}, read_at=read_at)


async def test_a_paused_queue_is_not_claimed_until_resumed_and_listed(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    workers = _workers(processes, database_url, side_channel, 1)
    await workers_started(processes, workers)
    paused = kenning_command("queues", "pause", "test-pausable", url=database_url)
    assert paused.returncode == 0 and paused.stdout.strip() == "test-pausable: paused", paused
    async with Client(database=database) as client:
        held = [(await client.start(queues_app.anywhere, n=n, queue="test-pausable")).instance_id for n in range(3)]
        # two instances of no queue started after them: once both ran, the worker's claims
        # have passed over the paused queue's due instances (each pass asks every queue)
        for n in range(2):
            marker = (await client.start(queues_app.anywhere, n=n)).instance_id
            assert await asyncio.wait_for(client.result(marker), 30) == n
        statuses = sql.execute(
            "SELECT status, started_at FROM kenning_instances WHERE id = ANY(%s)", (held,)
        ).fetchall()
        assert statuses == [("pending", None)] * 3
        listed = kenning_command("queues", "list", url=database_url)
        assert listed.returncode == 0, listed
        lines = listed.stdout.splitlines()
        assert lines[0].split() == ["QUEUE", "DEPTH", "RUNNING", "OLDEST", "LIMITS", "PAUSED"]
        row = next(line.split() for line in lines if line.startswith("test-pausable "))
        assert row[1:3] == ["3", "0"] and row[-1] == "yes", row
        payments = next(line for line in lines if line.startswith("test-payments "))
        assert "concurrency=3" in payments and payments.split()[-1] == "no"
        resumed = kenning_command("queues", "resume", "test-pausable", url=database_url)
        assert resumed.returncode == 0, resumed
        assert await asyncio.wait_for(asyncio.gather(*(client.result(i) for i in held)), 30) == [0, 1, 2]
    listed_json = json.loads(kenning_command("queues", "list", "--json", url=database_url).stdout)
    pausable = next(q for q in listed_json if q["name"] == "test-pausable")
    assert pausable["paused"] is False and pausable["depth"] == 0
    unknown = kenning_command("queues", "pause", "no-such-queue", url=database_url)
    assert unknown.returncode == 2 and unknown.stderr.strip().count("\n") == 0
    assert "no queue 'no-such-queue'" in unknown.stderr
    check_invariants(sql)


async def test_a_cancel_on_a_full_queue_runs_its_compensations_without_waiting_for_a_slot(
    database: Database,
    database_url: str,
    sql: Sql,
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 38, item 4: the queue's one slot is held by an occupant that runs until the
    # test lets it go; the instance cancelled meanwhile is compensated before that, outside
    # the limit, and the occupant then finishes as it would have
    gate = tmp_path / "gate"
    gate.touch()
    monkeypatch.setenv("QUEUE_TEST_GATE", str(gate))
    workers = _workers(processes, database_url, side_channel, 1)
    await workers_started(processes, workers)
    async with Client(database=database) as client:
        waiting = (await client.start(queues_app.reserve_then_wait, n=1)).instance_id
        await eventually(
            lambda: _status(sql, waiting) == "waiting_for_event", timeout=30, message="reserved and waiting"
        )
        occupant = (await client.start(queues_app.occupant)).instance_id
        await eventually(
            lambda: executions(side_channel)[f"occupy start {occupant}"] == 1, timeout=30, message="slot taken"
        )
        assert await client.cancel(waiting)
        await eventually(lambda: _status(sql, waiting) == "cancelled", timeout=30, message="cancel compensated")
        # the queue was full the whole time: its one slot is still the occupant's
        assert _status(sql, occupant) == "running"
        assert executions(side_channel)[f"occupy end {occupant}"] == 0
        assert executions(side_channel)[f"unreserve {waiting} gate=True"] == 1
        gate.unlink()
        assert await asyncio.wait_for(client.result(occupant), 30) == "done"
    kinds = [
        str(row[0])
        for row in sql.execute("SELECT kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (waiting,))
    ]
    assert kinds[-1] == "CompensationExecuted", kinds
    check_invariants(sql)


def _status(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


def test_the_claim_finds_cancelled_queued_instances_without_reading_a_backlog(sql: Sql) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, queue_name, "
        "partition_key) SELECT 'q-' || g, 'wf', 'h', '{}', now(), 'backlog', 'k' || (g % 100) "
        "FROM generate_series(1, 5000) AS g"
    )
    sql.execute("UPDATE kenning_instances SET cancel_requested = true WHERE id = 'q-7'")
    sql.execute("ANALYZE kenning_instances")
    statement = claims_sql._claim_statement(claims_sql.DEFAULT_MAX_RUNS, True)
    params = {
        "owner": "w",
        "names": ["wf"],
        "limit": 10,
        "lease_seconds": 30,
        "now": None,
        "code_version": None,
        "pinned": [],
    }
    with psycopg.ClientCursor(sql) as cursor:
        cursor.execute("EXPLAIN " + statement.sql, params)
        plan = "\n".join(str(row[0]) for row in cursor.fetchall())
    assert "kenning_instances_queued_cancelled" in plan, plan
    assert "kenning_instances_queued " not in plan, plan
    claimed = sql.execute(statement.sql, params).fetchall()
    assert [row[0] for row in claimed if row[0] is not None] == ["q-7"]  # outside the queue's claim


def test_a_workflow_parameter_named_like_a_start_option_is_refused_at_decoration() -> None:
    # Client.start(w, queue="jobs") would route the start into a queue, not pass the argument
    with pytest.raises(ConfigurationError, match="workflow 'takes_queue': parameter 'queue' is a start option's name"):

        @workflow
        async def takes_queue(ctx: WorkflowContext, queue: str) -> str:
            return queue

    async def reserved(ctx: WorkflowContext, **kwargs: object) -> None:
        return None

    for name in ("instance_id", "idempotency_key", "partition_key", "priority", "child_id", "on_parent_cancel"):
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        taken = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY)
        reserved.__signature__ = inspect.Signature([context, taken])  # type: ignore[attr-defined]
        with pytest.raises(ConfigurationError, match=f"parameter '{name}'"):
            workflow(reserved)


async def _queued(database: Database, queue: str, *starts: tuple[str, str, str]) -> None:
    """Start (id, workflow, partition key) instances into ``queue``."""
    async with database.connection() as conn:
        await instances_sql.instances_start(
            conn, [NewInstance(i, wf, "h", {}, queue_name=queue, partition_key=key) for i, wf, key in starts]
        )


async def test_an_expired_lease_is_not_renewed_once_its_slot_was_given_away(database: Database, sql: Sql) -> None:
    async with database.connection() as conn:
        await queues_sql.queues_declare(conn, [queues_sql.QueueLimits("one-slot", concurrency=1)])
    await _queued(database, "one-slot", ("a", "wf", ""), ("b", "wf", ""))
    claim = dict(queue="one-slot", workflow_names=["wf"], limit=5, lease_seconds=30, take_suspect=False)
    async with database.connection() as conn:
        (first,) = (await claims_sql.queue_claim(conn, owner="w1", **claim)).instances  # type: ignore[arg-type]
    # w1 stalled past its lease: the slot is free, and the queue's next claim admits b (a
    # suspect, its run before died too, so this claim, as one of a worker running a suspect, leaves it)
    sql.execute(
        "UPDATE kenning_instances SET available_at = now() - interval '1 second', runs_without_progress = 1"
        " WHERE id = %s",
        (first.id,),
    )
    async with database.connection() as conn:
        (second,) = (await claims_sql.queue_claim(conn, owner="w2", **claim)).instances  # type: ignore[arg-type]
        assert second.id != first.id
        # w1's heartbeat comes late: its lease is not renewed, its run must stop
        lost = await instances_sql.instance_heartbeat(conn, [first.lease_token, second.lease_token], 30)
    assert lost == {first.lease_token}
    held = "SELECT count(*) FROM kenning_instances WHERE available_at > now() AND lease_token IS NOT NULL"
    assert _count(sql, held) == 1


async def test_a_worker_claims_only_from_queues_of_its_workflows_and_moves_no_cursor_past_keys_it_cannot_serve(
    database: Database, sql: Sql
) -> None:
    await _queued(database, "mixed", ("x1", "mine", "k1"), ("x2", "mine", "k2"), ("x3", "mine", "k3"))
    await _queued(database, "mixed", ("y1", "theirs", "k4"))  # a second workflow into the queue is named too
    async with database.connection() as conn:
        assert await queues_sql.queue_names(conn, ["mine"]) == ["mixed"]
        assert await queues_sql.queue_names(conn, ["theirs", "nobody"]) == ["mixed"]
        assert await queues_sql.queue_names(conn, ["nobody"]) == []
        # a worker knowing none of k1..k3's workflow: it takes nothing there and the
        # round-robin's cursor stays, so k1 is still the next key served
        foreign = await claims_sql.queue_claim(
            conn, queue="mixed", owner="other", workflow_names=["nobody"], limit=2, lease_seconds=30
        )
        assert foreign.instances == []
        assert sql.execute("SELECT partition_cursor, claim_seq FROM kenning_queues").fetchone() == ("", 0)
        served = await claims_sql.queue_claim(
            conn, queue="mixed", owner="mine", workflow_names=["mine"], limit=1, lease_seconds=30
        )
    assert [c.id for c in served.instances] == ["x1"]
    assert sql.execute("SELECT partition_cursor FROM kenning_queues").fetchone() == ("k1",)


async def test_a_running_worker_claims_a_start_into_a_queue_it_had_not_read_at_once(database: Database) -> None:
    # polls an hour apart: only a NOTIFY can make it read its queues again in the test
    async with database.connection() as conn:  # declared by another app: names none of this worker's workflows
        await queues_sql.queues_declare(conn, [queues_sql.QueueLimits("test-late")])
    async with Client(database=database) as client, running_worker(database, queues_app.app, poll_interval=3600):
        # its first claim read its queues: neither test-new (not there yet) nor test-late
        plain = (await client.start(queues_app.anywhere, n=1)).instance_id
        assert await asyncio.wait_for(client.result(plain), 30) == 1
        # a start creating a queue, then the first start of its workflow into an existing one
        new = (await client.start(queues_app.anywhere, n=2, queue="test-new")).instance_id
        assert await asyncio.wait_for(client.result(new), 30) == 2
        late = (await client.start(queues_app.anywhere, n=3, queue="test-late")).instance_id
        assert await asyncio.wait_for(client.result(late), 30) == 3


def test_the_stuck_check_does_not_read_a_queues_backlog(sql: Sql) -> None:
    # queued runnable rows with no due time are found by an index holding only them, not
    # by a pass over kenning_instances_queued's whole backlog on every scheduler pass
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, queue_name, "
        "partition_key) SELECT 'q-' || g, 'wf', 'h', '{}', now(), 'backlog', 'k' || (g % 100) "
        "FROM generate_series(1, 5000) AS g"
    )
    sql.execute("ANALYZE kenning_instances")
    with psycopg.ClientCursor(sql) as cursor:
        cursor.execute("EXPLAIN " + progress_sql._STUCK_REPAIR.sql, {"limit": 100, "max_repairs": 3})
        plan = "\n".join(str(row[0]) for row in cursor.fetchall())
    assert "kenning_instances_queued_undue" in plan, plan
    assert "kenning_instances_queued " not in plan, plan
