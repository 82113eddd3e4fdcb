"""The schema, migrations, and the claim and fencing SQL, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import concurrent.futures
from datetime import timedelta

import psycopg
import pytest

from kenning.core.records import INSTANCE_STATUSES
from kenning.db import Database, statement
from kenning.db.migrate import current_revision, head_revision, migrate
from kenning.storage import claims as claims_sql
from kenning.storage import console as console_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql


@pytest.mark.smoke
def test_migrations_are_idempotent_and_safe_to_run_concurrently(empty_database_url: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        revisions = list(pool.map(lambda _: migrate(empty_database_url), range(4)))
    assert revisions == [head_revision()] * 4
    assert migrate(empty_database_url) == head_revision()
    assert current_revision(empty_database_url) == head_revision()
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM kenning_alembic_version").fetchone() == (1,)


async def _insert(database: Database, n: int, prefix: str = "i") -> None:
    async with database.transaction() as conn:
        for i in range(n):
            await instances_sql.instance_insert(
                conn,
                instance_id=f"{prefix}{i}",
                workflow_name="wf",
                source_hash="h",
                input_json={},
                idempotency_key=None,
            )


async def test_expired_lease_is_reclaimed_and_the_stale_token_is_fenced(database: Database) -> None:
    await _insert(database, 1)
    async with database.transaction() as conn:
        (first,) = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=["wf"], limit=10, lease_seconds=30)
        ).instances
        # while the lease holds nobody else can claim it
        assert (
            await claims_sql.instance_claim(conn, owner="b", workflow_names=["wf"], limit=10, lease_seconds=30)
        ).instances == []
    later = await _db_now(database) + timedelta(seconds=31)
    async with database.transaction() as conn:
        (second,) = (
            await claims_sql.instance_claim(
                conn, owner="b", workflow_names=["wf"], limit=10, lease_seconds=30, now=later
            )
        ).instances
    assert second.id == first.id and second.lease_token != first.lease_token and second.run_count == 2
    async with database.transaction() as conn:
        stale = await history_sql.history_record_step(
            conn,
            instance_id=first.id,
            token=first.lease_token,
            step_id="s:1",
            kind="ActivityCompleted",
            step_name="s",
            payload={"result": 1},
        )
        fresh = await history_sql.history_record_step(
            conn,
            instance_id=first.id,
            token=second.lease_token,
            step_id="s:1",
            kind="ActivityCompleted",
            step_name="s",
            payload={"result": 2},
            payload_bytes=b"\x00\xffraw",  # bytes travel inside the step's JSON (base64)
        )
        assert not await instances_sql.instance_complete(conn, first.id, first.lease_token, {"result": 1})
    assert stale is None and fresh is False
    async with database.connection() as conn:
        loaded = await history_sql.history_load(conn, [first.id])
    assert [(r.step_id, r.payload, r.payload_bytes) for r in loaded[first.id]] == [
        ("s:1", {"result": 2}, b"\x00\xffraw")
    ]


async def _db_now(database: Database):  # type: ignore[no-untyped-def]
    async with database.connection() as conn:
        return (await conn.execute(statement("SELECT now() AS now"))).one().now


async def test_claims_are_disjoint_under_concurrency(database: Database) -> None:
    await _insert(database, 100)

    async def claim(owner: str) -> list[str]:
        got: list[str] = []
        while True:
            async with database.transaction() as conn:
                batch = (
                    await claims_sql.instance_claim(conn, owner=owner, workflow_names=["wf"], limit=7, lease_seconds=30)
                ).instances
            if not batch:
                return got
            got += [c.id for c in batch]

    results = await asyncio.gather(*(claim(f"w{i}") for i in range(4)))
    flat = [i for r in results for i in r]
    assert sorted(flat) == sorted(f"i{i}" for i in range(100))
    assert len(flat) == len(set(flat))


async def test_claim_uses_the_partial_index_with_many_finished_instances(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, finished_at) "
        "SELECT 'done' || g, 'wf', 'completed', now() FROM generate_series(1, 50000) g"
    )
    await _insert(database, 5, prefix="live")
    sql.execute("ANALYZE kenning_instances")
    plan = "\n".join(
        str(r[0])
        for r in sql.execute(
            "EXPLAIN SELECT id FROM kenning_instances WHERE status IN ('pending', 'running', 'compensating') "
            "AND queue_name IS NULL AND available_at <= now() AND workflow_name = ANY(ARRAY['wf']) "
            "ORDER BY available_at LIMIT 10 "
            "FOR UPDATE SKIP LOCKED"
        ).fetchall()
    )
    assert "kenning_instances_claimable" in plan, plan


def test_claim_keeps_to_the_partial_index_when_statistics_predate_a_backlog(
    sql: psycopg.Connection[tuple[object, ...]],
) -> None:
    # statistics taken over finished instances of another workflow only, then a backlog of
    # the claimed one: an index the claim's columns match (0006's list indexes were keyed
    # on status and workflow_name) looks like a handful of rows to the planner, and
    # reading it means sorting the whole backlog; the claimable index stops at the limit
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, finished_at) "
        "SELECT 'done' || g, 'old', 'completed', now() FROM generate_series(1, 20000) g"
    )
    sql.execute("ANALYZE kenning_instances")
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, available_at) "
        "SELECT 'live' || g, 'wf', 'pending', now() - interval '1 hour' FROM generate_series(1, 20000) g"
    )
    params = {
        "owner": "probe",
        "names": ["wf"],
        "limit": 10,
        "lease_seconds": 30.0,
        "now": None,
        "code_version": "v1",
        "pinned": [],
    }
    plan = "\n".join(str(r[0]) for r in sql.execute("EXPLAIN " + claims_sql._INSTANCE_CLAIM.sql, params))
    assert "kenning_instances_claimable" in plan, plan
    assert "_status_created" not in plan, plan


def test_console_list_reads_its_own_indexes(sql: psycopg.Connection[tuple[object, ...]]) -> None:
    # the list's statements must compare status and workflow_name under COLLATE "C" to use
    # 0006's indexes (the claim above relies on no other statement doing so)
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, finished_at) "
        "SELECT 'done' || g, 'old', 'completed', now() FROM generate_series(1, 20000) g"
    )
    sql.execute("ANALYZE kenning_instances")
    for filters, index in [
        (console_sql.InstanceFilters(status="failed"), "kenning_instances_status_created"),
        (console_sql.InstanceFilters(status="failed", workflow="old"), "kenning_instances_workflow_status_created"),
    ]:
        shape = console_sql._shape(filters)
        params = {**console_sql._parameters(filters, None), "limit": 51, "scan_limit": 1000, "cap": 10000}
        params["statuses"] = list(INSTANCE_STATUSES)
        for st in (console_sql._page_statement(shape, False), console_sql._counts_statement(shape)):
            plan = "\n".join(str(r[0]) for r in sql.execute("EXPLAIN " + st.sql, params))
            assert index in plan and "Seq Scan" not in plan, plan


async def test_heartbeat_reports_leases_taken_over(database: Database) -> None:
    await _insert(database, 2)
    async with database.transaction() as conn:
        claimed = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=["wf"], limit=10, lease_seconds=30)
        ).instances
    tokens = [c.lease_token for c in claimed]
    later = await _db_now(database) + timedelta(seconds=60)
    async with database.transaction() as conn:
        retaken = (
            await claims_sql.instance_claim(
                conn, owner="b", workflow_names=["wf"], limit=1, lease_seconds=30, now=later
            )
        ).instances
    lost_id = retaken[0].id
    async with database.transaction() as conn:
        lost = await instances_sql.instance_heartbeat(conn, tokens, 30)
    assert lost == {c.lease_token for c in claimed if c.id == lost_id}


def test_claim_pacer_backs_off_after_empty_claims_and_not_after_a_quiet_spell() -> None:
    from kenning_worker.worker import ClaimPacer

    pacer = ClaimPacer(base=0.005, ceiling=0.04)
    assert pacer.delay(100.0) == 0.0  # never claimed: at once
    pacer.claimed(100.0, found=True)
    assert pacer.delay(100.001) == pytest.approx(0.004)  # wake-ups within 5 ms share a claim
    for expected in (0.01, 0.02, 0.04, 0.04):  # lost races double the spacing, up to the ceiling
        pacer.claimed(100.0, found=False)
        assert pacer.delay(100.0) == pytest.approx(expected)
    assert pacer.delay(101.0) == 0.0  # idle for longer than the spacing: claim at once
    pacer.claimed(101.0, found=True)
    assert pacer.delay(101.0) == pytest.approx(0.005)
