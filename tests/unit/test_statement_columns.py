"""The scan of the storage modules' statements, and its problems naming the statement and
the column. Against the schema: ``tests/integration/test_statement_columns.py``."""

from __future__ import annotations

import pytest

from tests.statement_columns import UNNAMED, column_problems, storage_statements

MIN_STATEMENTS = 40  # statement() constants in kenning.storage today: 51


def test_the_scan_sees_every_storage_module() -> None:
    statements = storage_statements()
    assert len(statements) >= MIN_STATEMENTS, [s.name for s in statements]


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["id", "notified"], []),
        (["cancel_requested", UNNAMED, UNNAMED], ["column 2 '?column?' is unnamed", "column 3 '?column?' repeats"]),
        (["count"], ["column 1 'count' is named after its expression"]),
        (["id", "id"], ["column 2 'id' repeats"]),
        (["now", "index"], ["column 2 'index' is hidden by a row method"]),
    ],
)
def test_problems_name_the_statement_and_the_column(columns: list[str], expected: list[str]) -> None:
    sql = "SELECT clock.now, count(*), index FROM (SELECT now() AS now) AS clock"
    problems = column_problems("subscriptions._X", sql, columns, {"count", "now", "pg_notify"})
    assert len(problems) >= len(expected)
    for fragment in expected:
        assert any(p.startswith("subscriptions._X: ") and fragment in p for p in problems), problems
    if not expected:
        assert problems == []
