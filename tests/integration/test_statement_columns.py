"""Every statement in ``kenning.storage`` names each column it returns, once.

Rows are read by name (``row.cancel_requested``). psycopg's ``namedtuple_row`` refuses a
row with two columns of one name (two unnamed expressions are both ``?column?``) and
raises only after the statement has committed; SQLAlchemy rows make such a name
ambiguous. So every selected expression carries an explicit, unique alias.

The statements are not executed: PostgreSQL describes each prepared statement's result
columns, which needs no parameters and writes nothing.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import pq

from kenning.core.records import SuspendOutcome
from kenning.db import Database
from kenning.db import Statement as SqlStatement
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import subscriptions as subscriptions_sql
from kenning.storage import timers as timers_sql
from tests.statement_columns import Statement, column_problems, storage_statements

# The storage modules that hold SQL; each must contribute at least one statement that
# returns rows, so a module the scan stopped seeing fails the test.
MODULES_WITH_ROWS = {"history", "inbox", "instances", "outbox", "subscriptions", "timers", "writes"}


MIN_WITH_ROWS = 30  # of which return rows today: 41


# Names PostgreSQL derives from an expression it was not asked to name: a CASE, or a
# function call (``count``, ``pg_notify``, ``extract``...), unless the function shares a
# column's name. Such a name is accepted only if the statement spells it as an alias
# (``AS now``) or a qualified column (``clock.now``).
DERIVED_FROM_EXPRESSION_SQL = """
    SELECT 'case' AS name
    UNION
    SELECT proname FROM pg_proc
    EXCEPT
    SELECT column_name FROM information_schema.columns WHERE table_name LIKE 'kenning\\_%'
"""


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def numbered(clause: SqlStatement) -> str:
    """The statement as psycopg runs it, with ``%(name)s`` turned into ``$n`` (one number
    per name) for a server-side prepare."""
    numbers: dict[str, int] = {}

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return _PLACEHOLDER.sub(replace, clause.sql)


def result_columns(conn: psycopg.Connection[tuple[object, ...]], statement: Statement) -> list[str] | None:
    """The names of the columns ``statement`` returns, or None if it returns no rows."""
    pgconn = conn.pgconn
    prepared = f"kenning_check_{abs(hash(statement.name))}".encode()
    result = pgconn.prepare(prepared, numbered(statement.clause).encode())
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise AssertionError(f"{statement.name} does not prepare: {pgconn.get_error_message()}")
    description = pgconn.describe_prepared(prepared)
    if description.status != pq.ExecStatus.COMMAND_OK:
        raise AssertionError(f"{statement.name} cannot be described: {pgconn.get_error_message()}")
    if description.nfields == 0:
        return None
    return [(description.fname(i) or b"").decode() for i in range(description.nfields)]


def test_every_statement_returns_uniquely_named_columns(database_url: str) -> None:
    statements = storage_statements()
    problems: list[str] = []
    with_rows: list[str] = []
    # One transaction, rolled back: the prepares touch nothing, and the scan leaves no trace.
    with psycopg.connect(database_url) as conn:
        derived = {str(row[0]) for row in conn.execute(DERIVED_FROM_EXPRESSION_SQL)}
        assert "count" in derived and "pg_notify" in derived and "position" not in derived
        for statement in statements:
            columns = result_columns(conn, statement)
            if columns is None:
                continue
            with_rows.append(statement.name)
            problems += column_problems(statement.name, statement.clause.sql, columns, derived)
        conn.rollback()
    assert not problems, "\n".join(problems)
    assert len(with_rows) >= MIN_WITH_ROWS, with_rows
    modules = {name.split(".")[0] for name in with_rows}
    assert modules >= MODULES_WITH_ROWS, f"no statement returning rows found in {MODULES_WITH_ROWS - modules}"


@pytest.mark.parametrize("wait", ["event", "timer"])
async def test_suspend_reads_its_row_on_the_autocommit_pool(database: Database, wait: str) -> None:
    """The defect this guards against: the wait_event suspend selected two unnamed
    columns, and the pool's named-tuple rows refused the row after the commit."""
    async with database.connection() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="i-1", workflow_name="wf", source_hash="", input_json={}, idempotency_key=None
        )
        (claim,) = (
            await claims_sql.instance_claim(conn, owner="w", workflow_names=["wf"], limit=1, lease_seconds=30)
        ).instances
        if wait == "event":
            outcome = await subscriptions_sql.subscription_register_and_suspend(
                conn,
                instance_id="i-1",
                token=claim.lease_token,
                step_id="wait:1",
                step_name="wait_event:paid",
                event_type="paid",
                match=None,
                since_at=None,
                since_seconds=None,
                timeout_seconds=60,
            )
        else:
            outcome = await timers_sql.timer_register_and_suspend(
                conn,
                instance_id="i-1",
                token=claim.lease_token,
                step_id="t:1",
                step_name="wait_timer",
                delay_seconds=60,
            )
        instance = await instances_sql.instance_get(conn, "i-1")
    assert outcome is SuspendOutcome.SUSPENDED
    assert instance is not None and instance.status == f"waiting_for_{wait}"
