"""Results without polling (issue 15, item 1): ``Client.result`` wakes on the NOTIFY of the
statement that finished the instance, on one LISTEN connection per client shared by all
its waiters, and polls only as a fallback. Every way to a terminal state notifies; the
poll interval is set far beyond the tests' timeouts, so a missing notification shows as
a timeout, not as a slow pass."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kenning import Client
from kenning.client import ResultTimeoutError
from kenning.core.names import CHANNEL_RESULTS, RESULTS_LISTENERS_LOCK, RESULTS_LISTENERS_LOCKS
from kenning.db import Database, Executor, statement
from kenning.errors import WorkflowFailedError
from kenning.storage import claims as claims_sql
from kenning.storage import results as results_sql
from kenning.storage.names import notify_results
from tests.logguard import expect_log
from tests.support import ProcessPool, eventually, kenning_command

APP = "tests.apps.results"
NEVER = 600.0  # the fallback poll, in the tests that must be woken by a notification
WITHIN = 20.0  # how long they wait at most (a loaded machine; a poll would take NEVER)

Sql = psycopg.Connection[tuple[object, ...]]


async def _worker_up(processes: ProcessPool, database_url: str, gate: Path | None = None) -> None:
    env = {"KENNING_TEST_GATE_FILE": str(gate)} if gate else {}
    worker = processes.worker(database_url, APP, "--poll-interval", "5", env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")


def _listeners(sql: Sql) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
        ("kenning-results",),
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


async def _waiting(client: Client, count: int) -> None:
    """Until ``count`` callers wait, each past its first read (the listener is up)."""

    def ready() -> bool:
        return client.results.waiting >= count and client.results.backend_pid is not None

    await eventually(ready, message="callers waiting")
    await asyncio.sleep(0.3)  # their first reads are done: what ends them now is a notification


async def test_a_result_arrives_by_notification_and_many_waiters_share_one_listener(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    await _worker_up(processes, database_url, gate)
    callers = 40
    async with Client(database=database, result_poll_interval=NEVER) as client:
        started = [await client.start("gated_sum", value=n) for n in range(callers)]
        waits = [asyncio.create_task(client.result(s.instance_id, timeout=NEVER)) for s in started]
        await _waiting(client, callers)
        assert _listeners(sql) == 1  # one LISTEN connection for all forty callers
        began = time.monotonic()
        gate.unlink()
        results = await asyncio.wait_for(asyncio.gather(*waits), timeout=WITHIN)
        assert results == [n + 1 for n in range(callers)]
        assert time.monotonic() - began < WITHIN
        # and one at a time, as a caller that starts and awaits one workflow after another
        # (started while the client listens: result() waits for the notification at once)
        for n in range(3):
            instance = await client.start("gated_sum", value=n)
            assert await asyncio.wait_for(client.result(instance.instance_id), timeout=WITHIN) == n + 1
        # its notification came before result() was called: it reads the row
        instance = await client.start("gated_sum", value=7)
        await eventually(lambda: _status(database_url, instance.instance_id) == "completed", message="finished")
        await asyncio.sleep(0.1)  # the notification has reached the client
        assert await asyncio.wait_for(client.result(instance.instance_id), timeout=WITHIN) == 8
    # closed with the client (its backend leaves pg_stat_activity a moment after the close)
    await eventually(lambda: _listeners(sql) == 0, timeout=10, message="the listener's backend gone")


async def test_every_terminal_path_notifies(
    database: Database, database_url: str, processes: ProcessPool, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    await _worker_up(processes, database_url, gate)
    expect_log("instance.failed")
    expect_log("compensation.failed")
    async with Client(database=database, result_poll_interval=NEVER) as client:
        completed = await client.start("gated_sum", value=1)
        failed = await client.start("gated_failure")
        compensated = await client.start("gated_compensated")
        saga_failed = await client.start("gated_saga_failure")
        cancelled = await client.start("awaits_cancel", key="k")
        ids = [completed, failed, compensated, saga_failed, cancelled]
        waits = [asyncio.create_task(client.result(s.instance_id)) for s in ids]
        await _waiting(client, len(ids))
        gate.unlink()
        await eventually(
            lambda: _status(database_url, cancelled.instance_id) == "waiting_for_event", message="waits for its event"
        )
        assert await client.cancel(cancelled.instance_id)
        outcomes: list[Any] = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), timeout=WITHIN)
    assert outcomes[0] == 2
    statuses = [o.status if isinstance(o, WorkflowFailedError) else o for o in outcomes[1:]]
    assert statuses == ["failed", "failed", "failed", "cancelled"]
    assert "CompensationFailed" in json.dumps(outcomes[3].error)  # the saga's own end (saga_fail)


def _status(database_url: str, instance_id: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return str(row[0]) if row else ""


async def test_the_claim_parking_a_crash_loop_notifies(database: Database) -> None:
    async with Client(database=database, result_poll_interval=NEVER) as client:
        instance = await client.start("gated_sum", value=1)  # no worker: the test claims it
        wait = asyncio.create_task(client.result(instance.instance_id))
        await _waiting(client, 1)
        async with database.connection() as conn:
            claimed = await claims_sql.instance_claim(
                conn, owner="w", workflow_names=["gated_sum"], limit=1, lease_seconds=0.01, max_runs=1
            )
            assert len(claimed.instances) == 1
            await asyncio.sleep(0.05)  # its lease expires without a step: the next claim parks it
            again = await claims_sql.instance_claim(
                conn, owner="w", workflow_names=["gated_sum"], limit=1, lease_seconds=30, max_runs=1
            )
        assert [p.id for p in again.parked] == [instance.instance_id]
        with pytest.raises(WorkflowFailedError) as failed:
            await asyncio.wait_for(wait, timeout=WITHIN)
    assert failed.value.status == "failed"


async def test_the_fallback_delivers_without_the_listener_and_without_a_notification(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    await _worker_up(processes, database_url, gate)
    expect_log("results.listener_disconnected")
    async with Client(database=database, result_poll_interval=0.5) as client:
        # the listening connection is killed: the waiter still gets its result, and the
        # listener connects again
        instance = await client.start("gated_sum", value=5)
        wait = asyncio.create_task(client.result(instance.instance_id))
        await _waiting(client, 1)
        killed = client.results.backend_pid
        sql.execute("SELECT pg_terminate_backend(%s)", (killed,))
        gate.unlink()
        assert await asyncio.wait_for(wait, timeout=WITHIN) == 6
        await eventually(lambda: client.results.backend_pid not in (None, killed), message="listening again")

        # an instance finished by a statement that notifies nobody: the poll finds it
        orphan = await client.start("no_such_workflow_runs_here", value=1)
        wait = asyncio.create_task(client.result(orphan.instance_id))
        await _waiting(client, 1)
        sql.execute(
            "UPDATE kenning_instances SET status = 'completed', result = %s, finished_at = now() WHERE id = %s",
            (json.dumps({"result": 42}), orphan.instance_id),
        )
        assert await asyncio.wait_for(wait, timeout=WITHIN) == 42

        # and a timeout is a timeout
        other = await client.start("no_such_workflow_runs_here", value=2)
        with pytest.raises(ResultTimeoutError):
            await client.result(other.instance_id, timeout=0.2)


def test_start_wait_returns_the_result(database_url: str, processes: ProcessPool) -> None:
    asyncio.run(_worker_up(processes, database_url))
    done = kenning_command("start", "gated_sum", "--input", '{"value": 41}', "--wait", "30", "--json", url=database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == 42


_NOTIFY_FINISHED = statement(
    f"""
    WITH finished AS (
        SELECT id FROM unnest(CAST(:ids AS text[])) AS id
    )
    SELECT {notify_results("finished")} AS notified
    """
)


async def _notified(database: Database, database_url: str, ids: list[str], *, joined: bool) -> list[str]:
    """The payloads a listener receives when a statement finishes ``ids``; ``joined``:
    it holds the listeners' lock, as kenning.client.results does."""
    with psycopg.connect(database_url, autocommit=True) as listener:
        if joined:
            listener.execute(
                "SELECT pg_advisory_lock_shared(k) FROM generate_series(%s, %s) AS k",
                (RESULTS_LISTENERS_LOCK, RESULTS_LISTENERS_LOCK + RESULTS_LISTENERS_LOCKS - 1),
            )
        listener.execute(f'LISTEN "{CHANNEL_RESULTS}"')
        async with database.connection() as conn:
            await conn.execute(_NOTIFY_FINISHED, {"ids": ids})
        listener.execute("SELECT 1")  # receives what was sent meanwhile
        return [n.payload for n in listener.notifies(timeout=0.5)]


async def test_finished_ids_are_chunked_under_the_payload_limit(database: Database, database_url: str) -> None:
    ids = [f"instance-{n:05d}-{'x' * (n % 50)}" for n in range(3000)] + ["long-" + "y" * 5000, 'quo"te\\d']
    payloads = await _notified(database, database_url, ids, joined=True)
    assert len(payloads) > 1 and all(len(p.encode()) < 8000 for p in payloads)
    sent = [i for p in payloads for i in json.loads(p)]
    assert None in sent  # the id too long for a payload wakes every waiter instead
    assert sorted(i for i in sent if i is not None) == sorted(ids[:-2] + ids[-1:])


async def test_nothing_is_notified_while_no_client_listens(database: Database, database_url: str) -> None:
    # a bare LISTEN without the listeners' lock is no client: the finishing statements
    # skip the NOTIFY (and its cost to every listening backend)
    assert await _notified(database, database_url, ["a", "b"], joined=False) == []
    assert [json.loads(p) for p in await _notified(database, database_url, ["a", "b"], joined=True)] == [["a", "b"]]


async def test_a_client_starting_to_listen_waits_for_a_finish_that_saw_no_listener(
    database: Database, database_url: str
) -> None:
    async def listen() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await results_sql.results_listen(Executor(conn))

    async with database.transaction() as conn:
        await conn.execute(_NOTIFY_FINISHED, {"ids": ["a"]})  # nobody listens: no NOTIFY
        joining = asyncio.create_task(listen())
        await asyncio.sleep(0.3)
        # it would miss this transaction's instances: it waits until their end is visible
        assert not joining.done()
    await asyncio.wait_for(joining, timeout=WITHIN)
