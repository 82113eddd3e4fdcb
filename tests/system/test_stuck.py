"""Nothing stuck silently: the scheduler's stuck check repairs an instance with no way
forward, or marks it with the reason a repair cannot help, and ``kenning why`` explains
any instance (issue 16, item 3; docs/architecture.md invariant 7)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests import invariants
from tests.scheduler_support import TIMER_APP, log_events, spawn_scheduler
from tests.support import ProcessPool, eventually, kenning_command

Sql = psycopg.Connection[tuple[Any, ...]]
FAST_CHECK = ("--stuck-check-interval", "0.2")


def _instance(sql: Sql, instance_id: str, workflow: str, status: str, **columns: Any) -> None:
    """An instance as a bug or a hand edit could leave it: a status and nothing else."""
    names = ["id", "workflow_name", "status", "input", *columns]
    values = [instance_id, workflow, status, '{"seconds": 0}', *columns.values()]
    sql.execute(f"INSERT INTO kenning_instances ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})", values)


def _status(sql: Sql, instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _stuck_reason(sql: Sql, instance_id: str) -> str | None:
    row = sql.execute("SELECT stuck_reason FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def test_instances_with_no_way_forward_are_repaired_and_run_to_completion(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str
) -> None:
    processes.worker(database_url, TIMER_APP)
    await eventually(
        lambda: sql.execute("SELECT 1 FROM kenning_workflow_definitions WHERE workflow_name = 'nap'").fetchone(),
        message="the worker registered its workflows",
    )
    # a wait whose timer row is gone; a runnable one with no due time; a leased one whose
    # lease has no expiry (a worker gone with it)
    _instance(sql, "timerless", "nap", "waiting_for_timer", run_count=1)
    _instance(sql, "dueless", "nap", "pending")
    _instance(
        sql, "expiryless", "nap", "running", lease_owner="gone", lease_token="7f0e7a4e-0d2d-4d5b-9f3b-1c1a7a0b0c0d"
    )
    scheduler = spawn_scheduler(processes, database_url, *FAST_CHECK)
    for instance_id in ("timerless", "dueless", "expiryless"):
        await eventually(lambda i=instance_id: _status(sql, i) == "completed", timeout=30, message=instance_id)  # type: ignore[misc]
    repaired = {e["instance_id"]: e for e in log_events(processes.log_of(scheduler), "instance.repaired")}
    assert set(repaired) == {"timerless", "dueless", "expiryless"}
    assert repaired["timerless"]["workflow"] == "nap"
    assert repaired["timerless"]["found"] == "waiting_for_timer without a timer"
    assert repaired["expiryless"]["level"] == "warning"
    invariants.every_instance_has_a_way_forward(sql)
    out = kenning_command("why", "timerless", url=database_url)
    assert out.returncode == 0, out.stderr
    assert "repaired 1 times" in out.stdout and "none needed: completed" in out.stdout


async def test_an_instance_repair_cannot_help_is_marked_once_with_its_reason(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    sql.execute("INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source) VALUES ('nap', 'h', '')")
    _instance(sql, "ghostly", "ghost", "waiting_for_timer")  # nobody has workflow 'ghost'
    _instance(sql, "poisoned", "nap", "waiting_for_event", stuck_repairs=3)  # repaired thrice already
    scheduler = spawn_scheduler(processes, database_url, *FAST_CHECK)
    await eventually(lambda: _stuck_reason(sql, "ghostly") and _stuck_reason(sql, "poisoned"))
    assert "no process ever registered workflow 'ghost'" in str(_stuck_reason(sql, "ghostly"))
    assert "repairing it does not help" in str(_stuck_reason(sql, "poisoned"))
    assert _status(sql, "ghostly") == "waiting_for_timer" and _status(sql, "poisoned") == "waiting_for_event"

    shown = kenning_command("instances", "show", "ghostly", url=database_url)
    assert shown.returncode == 0, shown.stderr
    assert "no way forward: waiting_for_timer without a timer, and no process ever registered" in shown.stdout
    as_json = json.loads(kenning_command("instances", "show", "poisoned", "--json", url=database_url).stdout)
    assert "repairing it does not help" in as_json["stuck_reason"]
    why = kenning_command("why", "ghostly", url=database_url)
    assert why.returncode == 0, why.stderr
    assert "no process ever registered workflow 'ghost'" in why.stdout
    why_json = json.loads(kenning_command("why", "poisoned", "--json", url=database_url).stdout)
    assert why_json["way_forward"].startswith("NONE: waiting for an event with no subscription")
    assert "repairing it does not help" in why_json["stuck_reason"]

    # once a process registers its workflow, the unknown one is repaired and loses its reason
    sql.execute(
        "INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source) VALUES ('ghost', 'h', '')"
    )
    await eventually(lambda: _status(sql, "ghostly") == "pending")
    assert _stuck_reason(sql, "ghostly") is None
    # found stuck by every check until then, each reported once
    stuck = log_events(processes.log_of(scheduler), "instance.stuck")
    assert sorted((e["instance_id"], e["workflow"], e["cause"]) for e in stuck) == [
        ("ghostly", "ghost", "unknown_workflow"),
        ("poisoned", "nap", "repair_failed"),
    ]
    # an operator's cancel gives the poisoned one a way forward: its reason goes with it
    sql.execute(
        "UPDATE kenning_instances SET status = 'pending', available_at = now() + interval '1 hour' "
        "WHERE id = 'poisoned'"
    )
    await eventually(lambda: _stuck_reason(sql, "poisoned") is None)


def test_why_explains_a_waiting_instance_and_refuses_an_unknown_id(database_url: str, sql: Sql) -> None:
    sql.execute(
        "INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source, retention_seconds) "
        "VALUES ('patient', 'h1', '', 3600)"
    )
    _instance(sql, "waiting", "patient", "waiting_for_event", source_hash="h1", run_count=2)
    sql.execute(
        "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, match, timeout_at) "
        "VALUES ('waiting', 'wait_event:paid:1', 'wait_event:paid', 'paid', '{\"order\": 7}', "
        "now() + interval '10 minutes')"
    )
    out = kenning_command("why", "waiting", url=database_url)
    assert out.returncode == 0, out.stderr
    assert "an event of type 'paid' matching {'order': 7}; times out" in out.stdout
    assert "2 claimed" in out.stdout
    assert "this instance's version since" in out.stdout
    assert len(out.stdout.splitlines()) <= 24  # one screen

    _instance(sql, "done", "patient", "completed", source_hash="h1", finished_at="2020-01-01T00:00:00Z")
    done = json.loads(kenning_command("why", "done", "--json", url=database_url).stdout)
    assert done["way_forward"] == "none needed: completed"
    assert "deleted 2020-01-01T01:00:00" in kenning_command("why", "done", url=database_url).stdout

    # a cancel request is a promise only while the instance runs on: once it ended, why says how
    _instance(sql, "undone", "patient", "cancelled", source_hash="h1", cancel_requested=True)
    undone = kenning_command("why", "undone", url=database_url).stdout
    assert "it was compensated and ended cancelled" in undone and "will be compensated" not in undone, undone
    _instance(sql, "halfundone", "patient", "failed", source_hash="h1", cancel_requested=True)
    halfundone = kenning_command("why", "halfundone", url=database_url).stdout
    assert "the rollback stopped at a failed compensation: it ended failed" in halfundone, halfundone
    assert "will end cancelled" not in halfundone, halfundone

    missing = kenning_command("why", "nope", url=database_url)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == "kenning why: no workflow instance 'nope'"
    assert "Traceback" not in missing.stderr


async def test_instances_due_long_ago_and_not_claimed_are_reported_per_workflow(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    """A way forward nobody takes (issue 25, item 3): due instances no worker claims are
    not stuck by their rows, yet wait for ever; the check reports them per workflow."""
    sql.execute("INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source) VALUES ('nap', 'h', '')")
    for n in range(3):  # due long ago, and no worker running
        _instance(sql, f"late-{n}", "nap", "pending", available_at="2000-01-01T00:00:00Z")
    _instance(sql, "fresh", "nap", "pending", available_at="2999-01-01T00:00:00Z")
    scheduler = spawn_scheduler(processes, database_url, *FAST_CHECK, "--overdue-seconds", "60")
    await eventually(lambda: log_events(processes.log_of(scheduler), "instances.overdue"), message="overdue reported")
    (report,) = log_events(processes.log_of(scheduler), "instances.overdue")[:1]
    assert (report["workflow"], report["count"], report["level"]) == ("nap", 3, "warning")
    assert report["hint"] == "due but not claimed; kenning why late-0"
