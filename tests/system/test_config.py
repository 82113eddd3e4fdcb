"""One variable, one meaning: a setting that differs per process carries the process's name
(``KENNING_SCHEDULER_BATCH_SIZE``), a shared one means the same everywhere, and an old
shared spelling of a per-process setting is refused instead of configuring several
processes at once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import psycopg

from tests.support import ProcessPool, eventually, kenning_command, run_kenning


def test_the_real_command_refuses_an_old_name_before_it_starts(database_url: str) -> None:
    done = run_kenning(["scheduler"], {"KENNING_DATABASE_URL": database_url, "KENNING_BATCH_SIZE": "7"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "kenning scheduler: error: KENNING_BATCH_SIZE is no longer read, as it meant different things "
        "in different processes: set KENNING_SCHEDULER_BATCH_SIZE"
    ]
    bad = run_kenning(["relayer"], {"KENNING_DATABASE_URL": database_url, "KENNING_RELAYER_BATCH_SIZE": "many"})
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "kenning relayer: error: KENNING_RELAYER_BATCH_SIZE='many' is invalid: invalid literal for int() "
        "with base 10: 'many'"
    ]


async def _started(pool: ProcessPool, proc: Any, event: str) -> dict[str, Any]:
    """The process's ``event`` line (its settings), once it has logged it."""

    def found() -> dict[str, Any]:  # empty until the line is there
        for line in pool.log_of(proc).splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("event") == event:
                return dict(record)
        return {}

    return await eventually(found, timeout=60, message=event)


async def test_one_environment_configures_each_process_by_its_own_names(
    database_url: str, processes: ProcessPool
) -> None:
    shared_env = {
        "KENNING_DATABASE_URL": database_url,
        "KENNING_MIGRATE": "false",
        "KENNING_POLL_INTERVAL": "0.5",  # shared: every process takes it
        "KENNING_SCHEDULER_BATCH_SIZE": "7",  # the scheduler's only
        "KENNING_WORKER_SHUTDOWN_GRACE_SECONDS": "4",  # the worker's only
        "KENNING_RELAYER_LEASE_SECONDS": "12",  # the relayer's only
        "KENNING_BROKER_URL": "http://127.0.0.1:9/",
        "KENNING_APP": "tests.apps.core",
    }
    scheduler = processes.spawn(["scheduler"], env=shared_env, name="scheduler")
    relayer = processes.spawn(["relayer"], env=shared_env, name="relayer")
    worker = processes.spawn(["worker"], env=shared_env, name="worker")
    started = {
        "scheduler": await _started(processes, scheduler, "scheduler.starting"),
        "relayer": await _started(processes, relayer, "relayer.starting"),
        "worker": await _started(processes, worker, "worker.starting"),
    }
    assert started["scheduler"]["batch_size"] == 7
    assert started["relayer"]["batch_size"] == 50
    assert started["worker"]["shutdown_grace_seconds"] == 4.0
    assert started["relayer"]["shutdown_grace_seconds"] == 10.0
    assert started["relayer"]["lease_seconds"] == 12.0
    assert started["worker"]["lease_seconds"] == 30.0
    assert {record["poll_interval"] for record in started.values()} == {0.5}


def test_start_with_an_app_uses_its_db_url(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "dburl_app.py").write_text(
        textwrap.dedent(
            f"""
            from kenning import App, WorkflowContext, workflow

            app = App("dburl", {database_url!r})


            @workflow
            async def greet(ctx: WorkflowContext, name: str) -> str:
                return name
            """
        )
    )
    done = kenning_command(
        "start", "greet", "--app", "dburl_app", "--input", '{"name": "x"}', "--allow-unknown", pythonpath=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    instance_id = done.stdout.strip()
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT workflow_name FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row == ("greet",)
