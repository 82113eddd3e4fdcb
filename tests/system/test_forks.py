"""Forking a failed saga through real worker processes and the real ``kenning`` command
(issue 37, item 2): the saga fails at its third step on the old code and is compensated; a
worker with the fix is deployed; ``kenning instances fork ID --from-step 3`` makes a new
instance that replays steps 1 and 2 from their records (they do not run again) and runs
step 3 on the new code. The command's mistakes are one line and exit 2; the two instances
link to each other in ``kenning instances show``; the action log has the fork."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg

from kenning import Client
from kenning.db import Database
from tests.apps import forks
from tests.console_support import became, console_ready, post_form, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, executions, workers_started
from tests.support import kenning_command as kenning

APP = "tests.apps.forks"
Sql = psycopg.Connection[tuple[object, ...]]


def _one_line_usage_error(done: Any, *expected: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stdout, done.stderr)
    assert all(text in lines[0] for text in expected), lines[0]
    assert "Traceback" not in done.stderr


async def test_a_failed_saga_forked_from_step_3_after_the_fix_runs_only_step_3(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="forks.saga")
    old = processes.worker(database_url, APP)  # the code with the bug
    async with Client(database=database) as client:
        original = (await client.start(forks.saga, order="o-7", amount=40)).instance_id
        await became(sql, original, "failed")
        ran = executions(side_channel)
        assert ran[f"reserve {original}"] == ran[f"charge {original} 40"] == ran[f"ship {original}"] == 1
        assert ran[f"release {original}"] == ran[f"refund {original}"] == 1  # compensated
        old.terminate()  # replaced by the deploy below
        old.wait(timeout=20)

        # the command's mistakes: one line each, exit 2, nothing made
        _one_line_usage_error(
            kenning("instances", "fork", "no-such-order", "--from-step", "3", url=database_url), "no-such-order"
        )
        _one_line_usage_error(
            kenning("instances", "fork", original, "--from-step", "9", url=database_url),
            "step 9 is out of range",
            "1 to 5",
        )
        _one_line_usage_error(
            kenning("instances", "fork", original, "--from-step", "3", "--input", "{not json", url=database_url),
            "invalid JSON",
        )
        _one_line_usage_error(
            kenning(
                "instances",
                "fork",
                original,
                "--from-step",
                "3",
                "--input",
                '{"order": "o-7"}',
                "--app",
                APP,
                url=database_url,
            ),
            "invalid input for workflow 'forks.saga'",
            "amount",
        )
        assert sql.execute("SELECT count(*) FROM kenning_instances WHERE forked_from = %s", (original,)).fetchone() == (
            0,
        )

        # the history as show numbers it: step 3 is the ship that failed
        shown = kenning("instances", "show", original, url=database_url)
        assert shown.returncode == 0, shown.stderr
        assert any(line.split()[:1] == ["3"] and "ship:1" in line for line in shown.stdout.splitlines()), shown.stdout

        new = processes.worker(database_url, APP, env={forks.FIXED: "1"})  # the deploy with the fix
        await workers_started(processes, [new])
        done = kenning("instances", "fork", original, "--from-step", "3", "--json", url=database_url)
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        fork_id = answer["fork_id"]
        assert (answer["instance_id"], answer["step"], answer["step_id"], answer["kept"]) == (original, 3, "ship:1", 2)
        assert "compensations undid 2 of the kept step(s)" in answer["message"]
        assert await client.result(fork_id, timeout=30) == "shipped o-7"

    ran = executions(side_channel)
    assert ran[f"reserve {fork_id}"] == 0 and ran[f"charge {fork_id} 40"] == 0  # steps 1 and 2: not run again
    assert ran[f"ship {fork_id}"] == 1  # step 3, on the fixed code
    assert ran[f"reserve {original}"] == 1 and ran[f"charge {original} 40"] == 1  # the original's, still once
    assert (await _status(sql, original)) == "failed"  # the original is left as it was

    # linked both ways
    shown_original = kenning("instances", "show", original, url=database_url).stdout
    assert f"forked to {fork_id} at step 3 (completed)" in shown_original
    shown_fork = kenning("instances", "show", fork_id, url=database_url).stdout
    assert any(line.startswith("forked from") and f"{original} at step 3" in line for line in shown_fork.splitlines())

    # recorded once, from the CLI, aimed at the original and naming the fork
    listed = kenning("actions", "list", "--target", original, "--json", url=database_url)
    assert listed.returncode == 0, listed.stderr
    entries = [e for e in json.loads(listed.stdout) if e["action"] == "fork"]
    assert len(entries) == 1 and entries[0]["origin"] == "cli" and entries[0]["affected"] == 1
    assert entries[0]["details"]["fork_id"] == fork_id and entries[0]["details"]["step"] == 3


async def _status(sql: Sql, instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_a_fork_that_would_keep_a_running_child_is_refused_by_the_cli_and_the_console(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    """A fork keeping a start_child whose child still runs would wait for ever (the child
    tells only the original of its end): exit 2 at the CLI, 422 in the console, one line
    naming the child and the step to fork from instead; nothing is made."""
    processes.worker(database_url, APP)
    url, console = spawn_console(processes, database_url, app=APP)
    await console_ready(url, console)
    async with Client(database=database) as client:
        original = (await client.start(forks.waiting_parent, n=3)).instance_id
        await became(sql, original, "waiting_for_event")
        row = sql.execute("SELECT id FROM kenning_instances WHERE parent_id = %s", (original,)).fetchone()
        assert row is not None
        child_id = str(row[0])
        await became(sql, child_id, "waiting_for_message")

    refused = kenning("instances", "fork", original, "--from-step", "2", url=database_url)
    _one_line_usage_error(
        refused, f"cannot fork {original}", f"started child {child_id}", "fork from step 1 or earlier"
    )
    async with httpx.AsyncClient(base_url=url, timeout=10, follow_redirects=False) as browser:
        answer = await post_form(browser, f"/instances/{original}/fork", {"step": "2", "input": ""})
        assert answer.status_code == 422, answer.text
        assert f"started child {child_id}, which is still running" in answer.text
        assert "fork from step 1 or earlier" in answer.text
    assert sql.execute("SELECT count(*) FROM kenning_instances WHERE forked_from = %s", (original,)).fetchone() == (0,)
