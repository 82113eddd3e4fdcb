"""Edda's own example programs on Kenning (issue 27, item 4), ported with the fewest changes
(``tests/apps/edda``: the import and the database URL). Each ``main()`` runs as Edda users
run it, ``python -m <module>``, in a process whose only database is the ``App(db_url=...)``
it makes; a worker loading the same module runs what it started.

Before the fix each ``main()`` stopped at ``await app.initialize()`` (no such method), and
without it at ``wf.start()``: "Workflow.start needs KENNING_DATABASE_URL".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from tests import logguard
from tests.logguard import expect_log
from tests.support import REPO_ROOT, ProcessPool, eventually

EXAMPLE_TIMEOUT = 60
Sql = psycopg.Connection[tuple[object, ...]]


def run_main(module: str, database_url: str) -> str:
    """``python -m module`` with no KENNING_* variable: its output, under the log guard."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_")}
    done = subprocess.run(
        [sys.executable, "-m", module],
        env={**env, "PYTHONPATH": str(REPO_ROOT), "EDDA_EXAMPLE_DB_URL": database_url},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
    )
    guard = logguard.current()
    if guard is not None:
        guard.watch_text(module, done.stdout + "\n" + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_simple_workflow_starts_in_main_and_a_worker_runs_it(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    output = run_main("tests.apps.edda.simple_workflow", database_url)
    found = re.search(r"Workflow started with instance ID: (\S+)", output)
    assert found is not None, output
    processes.worker(database_url, "tests.apps.edda.simple_workflow")
    async with Client(database=database) as client:
        result = await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    assert result["status"] == "completed"
    assert result["final_result"]["processing"] == {"processed": "HELLO WORLD FROM EDDA", "length": 21}


async def test_compensation_workflow_fails_and_undoes_in_reverse_order(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    expect_log("activity.failed", activity="ship_order")
    expect_log("activity.retry*")
    expect_log("instance.failed", workflow="order_workflow_with_compensation")
    output = run_main("tests.apps.edda.compensation_workflow", database_url)
    # Edda ran the workflow inside start() and printed this once it had failed; Kenning's
    # start() returns at once, so main() prints its "completed" line with the instance id
    found = re.search(r"\[Main\] Workflow completed: (\S+)", output)
    assert found is not None, output
    worker = processes.worker(database_url, "tests.apps.edda.compensation_workflow")
    async with Client(database=database) as client:
        with pytest.raises(WorkflowFailedError):
            await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    log = processes.log_of(worker)
    refund, release = log.index("[Compensation] Refunding payment"), log.index("[Compensation] Releasing inventory")
    assert refund < release, "compensations run last registered first"


async def test_long_running_loop_recurs_through_continue_as_new(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    """Edda's newest long_running_loop (its recur() is Kenning's continue_as_new): the batch
    processor goes through 50 items ten at a time, one run per batch, and the listener
    takes one published event per run, the instance id and its subscription kept."""
    processes.worker(database_url, "tests.apps.edda.long_running_loop", env={"EDDA_EXAMPLE_DB_URL": database_url})
    async with Client(database=database) as client:
        batches = await client.start("batch_processor", total_items=50, batch_size=10)
        result = await client.result(batches.instance_id, timeout=EXAMPLE_TIMEOUT)
        assert result == {"status": "completed", "message": "All 50 items processed", "processed_count": 50}
        assert (await client.status(batches.instance_id)).run == 5  # recurred after batches 1-4

        listener = (await client.start("event_listener", listener_id="listener-001")).instance_id

        def subscribed() -> bool:
            row = sql.execute("SELECT count(*) FROM kenning_channel_subscriptions WHERE channel = 'app.event'")
            return row.fetchone() == (1,)

        await eventually(subscribed, timeout=EXAMPLE_TIMEOUT, message="the listener subscribed")
        publisher = await client.start("event_publisher", message="Hello from publisher!")
        assert (await client.result(publisher.instance_id, timeout=EXAMPLE_TIMEOUT))["status"] == "published"
        for n in range(2):
            await client.publish("app.event", {"message": f"direct {n}"})

        def third_run_waits() -> bool:
            row = sql.execute("SELECT run, status FROM kenning_instances WHERE id = %s", (listener,))
            return row.fetchone() == (4, "waiting_for_message")

        await eventually(third_run_waits, timeout=EXAMPLE_TIMEOUT, message="three events, three recurs")
        assert (await client.status(listener)).input == {
            "listener_id": "listener-001",
            "events_processed": 3,
            "max_events_before_recur": 100,
        }
        await client.cancel(listener)
