"""The scan of the storage modules' statements, and its problems naming the statement and
the column. Against the schema: ``tests/integration/test_statement_columns.py``."""

from __future__ import annotations

import importlib
import keyword
import pkgutil
import re
from dataclasses import dataclass

import pytest
from sqlalchemy.engine import Row

import kenning.storage
from kenning.db import Statement as SqlStatement

MIN_STATEMENTS = 40  # statement() constants in kenning.storage today: 51


# The name PostgreSQL gives an expression it cannot name.
UNNAMED = "?column?"


@dataclass(frozen=True)
class Statement:
    name: str  # module.CONSTANT
    clause: SqlStatement


def storage_statements() -> list[Statement]:
    """Every ``kenning.db.Statement`` bound to a module-level name in a ``kenning.storage`` module."""
    found: dict[int, Statement] = {}
    for info in sorted(pkgutil.iter_modules(kenning.storage.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"kenning.storage.{info.name}")
        for attribute, value in sorted(vars(module).items()):
            if isinstance(value, SqlStatement) and id(value) not in found:
                found[id(value)] = Statement(f"{info.name}.{attribute}", value)
    return list(found.values())


def spelled_out(column: str, sql: str) -> bool:
    """Whether ``sql`` names ``column`` itself: an alias, or a qualified column reference."""
    name = re.escape(column)
    return re.search(rf"\bAS\s+{name}\b|\.{name}\b(?!\s*\()", sql, re.IGNORECASE) is not None


def column_problems(statement: str, sql: str, columns: list[str], derived: set[str]) -> list[str]:
    problems = []
    seen: set[str] = set()
    for position, column in enumerate(columns, start=1):
        where = f"{statement}: column {position} {column!r}"
        if column == UNNAMED:
            problems.append(f"{where} is unnamed: give the expression an alias")
        elif column in derived and not spelled_out(column, sql):
            problems.append(f"{where} is named after its expression, not an alias: give it one")
        elif not column.isidentifier() or keyword.iskeyword(column) or column.startswith("_"):
            problems.append(f"{where} is not a Python attribute name: rows are read by name")
        elif hasattr(Row, column) or hasattr(tuple, column):
            problems.append(f"{where} is hidden by a row method of that name (row.{column}): rename it")
        if column in seen:
            problems.append(f"{where} repeats an earlier column's name")
        seen.add(column)
    return problems


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
