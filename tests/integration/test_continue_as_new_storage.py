"""``kenning.storage.runs.run_continue`` against real PostgreSQL (issue 29, item 1): fenced by
the lease, refused after a cancel request with nothing written, and otherwise one statement
that ends the run and makes the next: summary row, history and compensations gone,
bookkeeping reset, children cancelled or detached, lease and deadline kept."""

from __future__ import annotations

import psycopg

from kenning.db import Database
from kenning.storage import runs as runs_sql

Sql = psycopg.Connection[tuple[object, ...]]
TOKEN = "00000000-0000-0000-0000-00000000000a"


def _seed(sql: Sql) -> None:
    """A running instance leased by TOKEN, two recorded steps, a compensation, counted
    attempts, a deadline; an unfinished child of each policy and a finished one."""
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, source_hash, status, input, lease_token, lease_owner,"
        " available_at, attempts, run_count, runs_without_progress, started_at, deadline_at)"
        " VALUES ('p', 'wf', 'h', 'running', '{\"n\": 1}', %s, 'w', now() + interval '30 s',"
        " '{\"act:1\": {\"attempts\": 2}}', 3, 1, now() - interval '1 minute', now() + interval '1 day')",
        (TOKEN,),
    )
    for step in ("receive:1", "act:1"):
        sql.execute(
            "INSERT INTO kenning_history (instance_id, step_id, kind, step_name) VALUES ('p', %s, 'X', 'x')", (step,)
        )
    sql.execute(
        "INSERT INTO kenning_compensations (instance_id, comp_id, position, function_name, args, kwargs)"
        " VALUES ('p', 'comp:1', 1, 'm:f', '[]', '{}')"
    )
    for child, status, policy in (("c-cancel", "pending", "cancel"), ("c-abandon", "waiting_for_event", "abandon"),
                                  ("c-done", "completed", "cancel")):  # fmt: skip
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, source_hash, status, input, parent_id, parent_step,"
            " on_parent_cancel) VALUES (%s, 'child', 'h', %s, '{}', 'p', 'start_child:child:1', %s)",
            (child, status, policy),
        )


async def test_a_stale_lease_writes_nothing_and_a_cancel_request_wins(database: Database, sql: Sql) -> None:
    _seed(sql)
    async with database.connection() as conn:
        assert await runs_sql.run_continue(conn, "p", "00000000-0000-0000-0000-00000000000b", {"n": 2}) is None
    sql.execute("UPDATE kenning_instances SET cancel_requested = true WHERE id = 'p'")
    async with database.connection() as conn:
        assert await runs_sql.run_continue(conn, "p", TOKEN, {"n": 2}) == runs_sql.Continued(None)
    assert sql.execute("SELECT run, input FROM kenning_instances WHERE id = 'p'").fetchone() == (1, {"n": 1})
    assert sql.execute("SELECT count(*) FROM kenning_history WHERE instance_id = 'p'").fetchone() == (2,)
    assert sql.execute("SELECT count(*) FROM kenning_instance_runs").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM kenning_instances WHERE parent_id = 'p'").fetchone() == (3,)


async def test_one_statement_ends_the_run_and_makes_the_next(database: Database, sql: Sql) -> None:
    _seed(sql)
    async with database.connection() as conn:
        continued = await runs_sql.run_continue(conn, "p", TOKEN, {"n": 2})
    assert continued == runs_sql.Continued(2, detached_children=2)
    row = sql.execute(
        "SELECT run, input, status, CAST(lease_token AS text), attempts, run_count, runs_without_progress,"
        " deadline_at > now() FROM kenning_instances WHERE id = 'p'"
    ).fetchone()
    # the next run's input, empty bookkeeping; lease, status, claims and deadline kept
    assert row == (2, {"n": 2}, "running", TOKEN, {}, 3, 0, True)
    assert sql.execute("SELECT count(*) FROM kenning_history WHERE instance_id = 'p'").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM kenning_compensations WHERE instance_id = 'p'").fetchone() == (0,)
    summary = sql.execute(
        "SELECT run, input, steps, ended, ended_at > started_at FROM kenning_instance_runs WHERE instance_id = 'p'"
    ).fetchall()
    assert summary == [(1, {"n": 1}, 2, "continued_as_new", True)]
    children = sql.execute("SELECT id, parent_id FROM kenning_instances WHERE id LIKE 'c-%' ORDER BY id").fetchall()
    assert children == [("c-abandon", None), ("c-cancel", None), ("c-done", "p")]  # the finished one stays
    cancels = sql.execute("SELECT instance_id FROM kenning_inbox WHERE kind = 'cancel'").fetchall()
    assert cancels == [("c-cancel",)]

    async with database.connection() as conn:  # and again: run 2 starts where run 1 ended
        assert await runs_sql.run_continue(conn, "p", TOKEN, {"n": 3}) == runs_sql.Continued(3)
        chain = await runs_sql.runs_list(conn, "p")
    assert [(r.run, r.steps, r.ended) for r in chain] == [(1, 2, "continued_as_new"), (2, 0, "continued_as_new"),
                                                          (3, 0, "running")]  # fmt: skip
    assert chain[1].started_at == chain[0].ended_at and chain[2].started_at == chain[1].ended_at
