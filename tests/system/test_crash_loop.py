"""Crash loops (issue 13, item 1): an instance whose activity kills its worker process is
parked as failed with reason ``crash_loop`` after ``--max-runs`` runs, instead of taking
the worker fleet down again and again; the instances around it finish; an operator's
``kenning instances retry`` makes it runnable again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import psycopg
import pytest
from sqlalchemy import text

from kenning import App, Client, WorkflowContext, activity, workflow
from kenning.db import Database, statement
from kenning.engine.outcomes import RunOutcome
from kenning.engine.run import WorkflowRun
from kenning.storage import claims as claims_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from tests.logguard import expect_log
from tests.support import (
    ProcessPool,
    check_invariants,
    eventually,
    executions,
    kenning_command,
    running_worker,
    workers_started,
)

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
    # a 3 s lease (heartbeat every second): on a loaded machine a shorter one may expire
    # under a live worker, and a second worker would run the poison too
    options = ("--max-runs", str(MAX_RUNS), "--lease-seconds", "3", "--concurrency", "8")

    def start_worker() -> psutil.Popen:
        return processes.worker(database_url, APP, *options, env=env)

    workers = [start_worker() for _ in range(2)]
    await workers_started(processes, workers)
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
    deadline = time.monotonic() + 240  # each death costs a lease (3 s) and a worker start
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

    def crash_loop_lines() -> int:
        return "".join(processes.log_of(proc) for proc, _ in processes.procs).count('"instance.crash_loop"')

    # the worker reports a parked instance in a task of its own, after the claim committed
    # (kenning_worker/crashloop.py): the status can be read before the line is written
    await eventually(crash_loop_lines, timeout=15, message="the crash loop reported")
    assert crash_loop_lines() == 1
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
    recorded a step; a dead worker's instances are taken over together, but a run whose
    run before died too is a suspect, one handed out per claim; at ``max_runs`` the
    instance is parked instead of handed out; a clean release resets the count."""
    async with database.transaction() as conn:
        for name in ("a", "b", "c"):
            await instances_sql.instance_insert(
                conn, instance_id=name, workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
            )
        now = (await conn.execute(statement("SELECT now() AS now"))).one().now

    def claim(seconds: float, *, max_runs: int = 3, take_suspect: bool = True) -> Awaitable[claims_sql.Claim]:
        return _claim(
            database, now + timedelta(seconds=seconds), lease_seconds=1, max_runs=max_runs, take_suspect=take_suspect
        )

    def taken(claimed: claims_sql.Claim) -> list[tuple[str, bool, bool]]:
        return sorted((c.id, c.taken_over, c.suspect) for c in claimed.instances)

    first = await claim(0)
    assert taken(first) == [("a", False, False), ("b", False, False), ("c", False, False)]
    # their worker dies (the leases expire): no evidence against any, all taken over at once
    second = await claim(5)
    assert taken(second) == [("a", True, False), ("b", True, False), ("c", True, False)]
    b = next(c for c in second.instances if c.id == "b")
    async with database.connection() as raw:
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
    # they die again: a and c died twice in a row without a step, suspects now, one per
    # claim; b made progress, so it is taken over with the first of them
    third = await claim(10)
    assert taken(third) == [("a", True, True), ("b", True, False)]
    assert taken(await claim(10, take_suspect=False)) == []  # a worker that runs a suspect takes no other
    fourth = await claim(10)
    assert taken(fourth) == [("c", True, True)]
    assert await _counts(database) == {"a": ("running", 2, 3), "b": ("running", 0, 3), "c": ("running", 2, 3)}
    # a dies a third time: parked (max_runs 3) instead of handed out
    fifth = await claim(20)
    assert [p.id for p in fifth.parked] == ["a"] and [p.runs_without_progress for p in fifth.parked] == [3]
    # b and c died too: b (a step the run before) is taken over beside a; c, a suspect
    # too, is left to a claim of its own, which parks it
    assert taken(fifth) == [("b", True, False)]
    sixth = await claim(20)
    assert [p.id for p in sixth.parked] == ["c"] and sixth.instances == []
    assert (await _counts(database))["a"] == ("failed", 3, 3)
    # a clean end (release) is no run to count
    async with database.connection() as raw:
        assert await instances_sql.instance_release(raw, "b", fifth.instances[0].lease_token)
    assert taken(await claim(30, take_suspect=False)) == [("b", False, False)]
    # the operator's retry makes a runnable again, its count reset
    async with database.transaction() as conn:
        assert (await instances_sql.instance_retry(conn, "a"))["retried"]
    assert (await _counts(database))["a"] == ("pending", 0, 3)


async def test_a_run_that_raised_counts_like_an_expired_lease(database: Database) -> None:
    """The worker hands back a run that raised as an expired lease: the next claim takes
    it over and counts it; at max_runs it is parked; a cancel then resumes it to be
    compensated, its count reset."""
    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="r", workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
        )
        now = (await conn.execute(statement("SELECT now() AS now"))).one().now

    def claim(seconds: float, *, take_suspect: bool = True) -> Awaitable[claims_sql.Claim]:
        return _claim(database, now + timedelta(seconds=seconds), lease_seconds=30, take_suspect=take_suspect)

    async def crashed(claimed: claims_sql.Claim) -> None:
        (instance,) = claimed.instances
        async with database.connection() as conn:
            assert await instances_sql.instance_release_crashed(conn, instance.id, instance.lease_token, 0)
            # its old token is no lease any more: a late write or heartbeat of it is fenced off
            assert not await instances_sql.instance_release(conn, instance.id, instance.lease_token)

    first = await claim(0)
    assert [(c.id, c.suspect) for c in first.instances] == [("r", False)]
    await crashed(first)
    # its first such run is no evidence yet: taken over by any claim
    second = await claim(1, take_suspect=False)
    assert [(c.id, c.taken_over, c.suspect) for c in second.instances] == [("r", True, False)]
    assert (await _counts(database))["r"] == ("running", 1, 2)
    await crashed(second)
    third = await claim(2)
    assert [(p.id, p.runs_without_progress) for p in third.parked] == [("r", 2)] and third.instances == []
    async with database.connection() as raw:
        row = await instances_sql.instance_get(raw, "r")
    assert row is not None and row.error is not None
    assert row.error["message"] == claims_sql.crash_loop_message("r", 2, 2)  # one text, stored and logged

    # a parked saga that was compensating: a cancel resumes its compensations
    async with database.transaction() as conn:
        await conn.execute(
            statement("UPDATE kenning_instances SET error = jsonb_set(error, '{resume_status}', '\"compensating\"')")
        )
        assert await instances_sql.instance_request_cancel(conn, "r") == ("failed", True)
        row = await instances_sql.instance_get(conn, "r")
    assert row is not None
    assert (row.status, row.cancel_requested, row.runs_without_progress, row.error) == ("compensating", True, 0, None)


inprocess = App("kenning-crash-loop-inprocess")


@workflow
async def raises_in_replay(ctx: WorkflowContext) -> str:
    return "done"


async def test_an_instance_whose_run_raises_every_time_is_parked_and_a_cancel_ends_it(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that raises unexpectedly (``instance.run_crashed``: a bug the replay does not
    handle) is handed back for another run; before, that clean release reset the count,
    so the instance ran again every second for ever. Now each such run counts, and
    ``--max-runs`` of them park it. A cancel of the parked instance is accepted: it
    resumes only to be compensated and ends ``cancelled``."""
    runs: list[str] = []
    original = WorkflowRun.run

    async def run(self: WorkflowRun) -> RunOutcome:
        if self.workflow_name == "raises_in_replay" and not self.cancel_requested:
            runs.append(self.instance_id)
            raise RuntimeError("a bug the replay does not handle")
        return await original(self)

    monkeypatch.setattr(WorkflowRun, "run", run)
    async with Client(database=database) as client, running_worker(database, inprocess, max_runs=MAX_RUNS):
        started = await client.start("raises_in_replay")
        iid = started.instance_id
        expect_log("instance.run_crashed", instance_id=iid)
        expect_log("instance.crash_loop", instance_id=iid)

        await eventually(lambda: _status(sql, iid) == "failed", timeout=30, message="parked as crash_loop")
        async with database.connection() as conn:
            row = await instances_sql.instance_get(conn, iid)
        assert row is not None and row.error is not None
        assert (row.error["reason"], row.runs_without_progress, row.run_count) == ("crash_loop", MAX_RUNS, MAX_RUNS)
        assert len(runs) == MAX_RUNS  # never handed out again

        assert await client.cancel(iid)  # a crash-looped instance can still be given up on
        with pytest.raises(Exception, match="cancel"):
            await client.result(iid, timeout=30)
    assert _status(sql, iid) == "cancelled"
    assert len(runs) == MAX_RUNS


release_held = asyncio.Event()


@activity
async def write_in_session(ctx: WorkflowContext) -> int:
    await ctx.session.execute(text("SELECT 1"))  # recorded in its own transaction
    return 1


@activity
async def hold(ctx: WorkflowContext) -> int:
    await release_held.wait()
    return 2


@workflow
async def records_in_its_transaction(ctx: WorkflowContext) -> int:
    return await write_in_session(ctx) + await hold(ctx)


async def test_a_suspect_that_records_a_step_in_its_own_transaction_frees_the_suspect_slot(
    database: Database,
) -> None:
    """A worker runs one suspect at a time until it records a step. A step recorded in
    the activity's own transaction (ctx.session) does not pass through the worker's group
    commit: before, it never freed the slot, so no other suspect was taken while it ran."""
    release_held.clear()
    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn,
            instance_id="suspect",
            workflow_name="records_in_its_transaction",
            source_hash="h",
            input_json={},
            idempotency_key=None,
        )
    async with database.connection() as conn:  # a worker that died: its lease has expired
        dead = await claims_sql.instance_claim(
            conn, owner="dead", workflow_names=["records_in_its_transaction"], limit=1, lease_seconds=-60
        )
    assert [c.id for c in dead.instances] == ["suspect"]
    async with database.connection() as conn:  # and the run before it died so too: a suspect
        await conn.execute(statement("UPDATE kenning_instances SET runs_without_progress = 1"))
    # a 9 s lease: the heartbeat (every 3 s) sees the step long before the suspect has
    # outlived a lease, the other way its slot is freed
    async with Client(database=database) as client, running_worker(database, inprocess, lease_seconds=9) as worker:
        await eventually(lambda: worker._suspect is not None, timeout=15, message="the suspect claimed")
        await eventually(lambda: worker._suspect is None, timeout=8, message="its step freed the suspect slot")
        release_held.set()
        assert await client.result("suspect", timeout=15) == 3


@workflow
async def quick(ctx: WorkflowContext) -> int:
    return 5


class SlowFailureHook:
    """An ``on_workflow_failed`` hook that takes as long as the test says."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.proceed = asyncio.Event()

    async def on_workflow_failed(self, instance_id: str, workflow_name: str, error: BaseException) -> None:
        self.called.set()
        await self.proceed.wait()


async def test_the_runs_claimed_beside_a_parked_instance_do_not_wait_for_its_failure_hook(
    database: Database,
) -> None:
    """Before, the worker awaited the failure hook of what the claim parked before it
    started the runs claimed in the same statement: their leases were not renewed
    meanwhile, and a hook slower than the lease let another worker run them too."""
    hook = SlowFailureHook()
    app = App("kenning-crash-loop-hook", hooks=hook)
    async with database.transaction() as conn:
        for iid, name in (("doomed", "raises_in_replay"), ("beside", "quick")):
            await instances_sql.instance_insert(
                conn, instance_id=iid, workflow_name=name, source_hash="h", input_json={}, idempotency_key=None
            )
    async with database.connection() as raw:  # doomed: one more run without progress parks it
        claimed = await claims_sql.instance_claim(
            raw, owner="dead", workflow_names=["raises_in_replay"], limit=1, lease_seconds=-60
        )
        assert [c.id for c in claimed.instances] == ["doomed"]
        await raw.execute(statement("UPDATE kenning_instances SET runs_without_progress = :n"), {"n": MAX_RUNS - 1})
    expect_log("instance.crash_loop", instance_id="doomed")
    async with Client(database=database) as client, running_worker(database, app, max_runs=MAX_RUNS):
        await asyncio.wait_for(hook.called.wait(), timeout=15)
        assert await client.result("beside", timeout=15) == 5  # while the hook still runs
        hook.proceed.set()
    assert (await _counts(database))["doomed"] == ("failed", MAX_RUNS, 1)


async def _counts(database: Database) -> dict[str, tuple[str, int, int]]:
    async with database.connection() as conn:
        rows = await conn.execute(
            statement("SELECT id, status, runs_without_progress, run_count FROM kenning_instances ORDER BY id")
        )
        return {row.id: (row.status, row.runs_without_progress, row.run_count) for row in rows}


def _status(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


def _states(sql: psycopg.Connection[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT workflow_name, status, run_count, runs_without_progress FROM kenning_instances ORDER BY created_at"
    ).fetchall()


async def _claim(
    database: Database, at: datetime, *, lease_seconds: float, take_suspect: bool = True, max_runs: int = 2
) -> claims_sql.Claim:
    """One claim of workflow ``wf`` at database time ``at``, parking at ``max_runs`` runs."""
    async with database.connection() as conn:
        return await claims_sql.instance_claim(
            conn,
            owner="w",
            workflow_names=["wf"],
            limit=10,
            lease_seconds=lease_seconds,
            max_runs=max_runs,
            take_suspect=take_suspect,
            now=at,
        )
