"""Safe deploys through real processes: ``kenning replay-check`` over an instance of
version A waiting for its payment, against three changed versions; then a worker with the
patched version deployed over it (tests/apps/replay_*.py)."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg

from kenning import Client
from kenning.core.names import PATCH_MARKER
from kenning.db import Database
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from tests.apps.replay_steps import PAID
from tests.support import ProcessPool, eventually, executions, run_kenning

Sql = psycopg.Connection[tuple[object, ...]]


def replay_check(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The check as a deploy pipeline runs it; with the side channel, so an activity it
    ran would show."""
    env = {
        "PATH": "/usr/bin:/bin",
        "KENNING_DATABASE_URL": database_url,
        "KENNING_TEST_SIDE_CHANNEL": os.environ["KENNING_TEST_SIDE_CHANNEL"],
    }
    return run_kenning(["replay-check", *args], env)


def status(sql: Sql, instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return str(row[0]) if row else ""


def history(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()


async def pay(database: Database, order_id: str) -> None:
    event = NewEvent("shop", f"paid-{order_id}", PAID, {"specversion": "1.0"}, {"order_id": order_id})
    async with database.transaction() as conn:
        await inbox_sql.inbox_insert_events(conn, [event])


async def test_replay_check_gates_a_deploy_and_ctx_patched_makes_it_safe(
    database: Database, database_url: str, sql: Sql, side_channel: str, processes: ProcessPool
) -> None:
    old_worker = processes.worker(database_url, "tests.apps.replay_v1")
    async with Client(database=database) as client:
        await client.start("replay_order", instance_id="old-1", order_id="o1")
        await eventually(lambda: status(sql, "old-1") == "waiting_for_event", message="old-1 waits for its payment")
    old_worker.terminate()
    old_worker.wait(timeout=15)
    before = history(sql, "old-1")
    assert before == [("reserve:1", "ActivityCompleted")]

    # B renamed the step old-1 already ran: the check names the instance and the step
    renamed = replay_check(database_url, "--app", "tests.apps.replay_renamed")
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    (line,) = [line for line in renamed.stdout.splitlines() if line.startswith("old-1")]
    assert "DIVERGES at step 'reserve:1': recorded 'reserve', the code now runs 'reserve_v2'" in line
    assert "1 would break" in renamed.stdout.splitlines()[-1]
    as_json = json.loads(replay_check(database_url, "--app", "tests.apps.replay_renamed", "--json").stdout)
    assert as_json["diverged"] == 1 and as_json["in_flight"] == 1
    (found,) = as_json["instances"]
    assert found["instance_id"] == "old-1" and found["verdict"] == "diverged"
    assert (found["step_id"], found["recorded_name"], found["new_name"]) == ("reserve:1", "reserve", "reserve_v2")

    # B' only adds a step after the wait, and B'' puts B's change behind ctx.patched
    for version in ("tests.apps.replay_extended", "tests.apps.replay_patched"):
        fine = replay_check(database_url, "--app", version, "--workflow", "replay_order")
        assert fine.returncode == 0, fine.stdout + fine.stderr
        assert "old-1  replay_order  waiting_for_event  ok: 1 step(s) replayed, goes on with wait_event" in fine.stdout
        assert "none diverges" in fine.stdout

    # the checks ran nothing and wrote nothing
    assert executions(side_channel) == {"reserve old-1": 1}
    assert history(sql, "old-1") == before and status(sql, "old-1") == "waiting_for_event"

    # deploy B'': old-1 finishes on the old path, a new instance takes the new path
    processes.worker(database_url, "tests.apps.replay_patched")
    async with Client(database=database) as client:
        await client.start("replay_order", instance_id="new-1", order_id="o2")
        await eventually(lambda: status(sql, "new-1") == "waiting_for_event", message="new-1 waits for its payment")
        await pay(database, "o1")
        await pay(database, "o2")
        assert await client.result("old-1", timeout=15) == "o1 shipped on the old path"
        assert await client.result("new-1", timeout=15) == "o2 shipped on the new path"
    assert executions(side_channel) == {"reserve old-1": 1, "ship old-1": 1, "reserve_v2 new-1": 1, "ship new-1": 1}
    assert [kind for _, kind in history(sql, "old-1")].count(PATCH_MARKER) == 0
    assert history(sql, "new-1")[0] == ("patch:reserve-v2", PATCH_MARKER)

    # both finished histories replay on B''; B breaks the old one's
    after = replay_check(database_url, "--app", "tests.apps.replay_patched")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "checked 2 instance(s) (0 in flight, 2 finished)" in after.stdout
    assert "old-1  replay_order  completed  ok: 3 step(s) replayed, completes" in after.stdout
    assert replay_check(database_url, "--app", "tests.apps.replay_renamed").returncode == 1
    assert replay_check(database_url, "--app", "tests.apps.replay_renamed", "--finished", "0").returncode == 0


def test_bad_input_is_one_line_and_exit_code_2(database_url: str, side_channel: str) -> None:
    for args, message in [
        (("--app", "tests.apps.no_such_module"), "cannot import application module 'tests.apps.no_such_module'"),
        (("--app", "tests.apps.replay_v1", "--workflow", "replay_ordr"), "did you mean 'replay_order'?"),
        (("--app", "tests.apps.replay_steps"), "define no workflow"),
    ]:
        done = replay_check(database_url, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    # argparse's own refusal: the usage, then one line
    done = replay_check(database_url, "--app", "tests.apps.replay_v1", "--limit", "0")
    assert done.returncode == 2 and "argument --limit" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
