"""What the statement-columns tests share: every storage statement, and the problems a
result column's name can have (rows are read by name). The unit tier checks the scan and
the rules; tests/integration/test_statement_columns.py asks PostgreSQL for each
statement's columns."""

from __future__ import annotations

import importlib
import keyword
import pkgutil
import re
from dataclasses import dataclass

from sqlalchemy.engine import Row

import kenning.storage
from kenning.db import Statement as SqlStatement

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
