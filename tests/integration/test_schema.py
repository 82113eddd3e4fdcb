"""``kenning.storage.tables`` says what the migrations create.

The DDL is the Alembic migrations; ``shared/kenning/storage/tables.py`` restates the tables
as SQLAlchemy Core tables. Against a freshly migrated database, both ways: every table and
column of the module exists with the same type (normalised: PostgreSQL's own type names),
nullability and primary key, and the database has no ``kenning_*`` table or column the
module lacks (``kenning_alembic_version`` is Alembic's, see ``kenning/db/migrate.py``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Table
from sqlalchemy.dialects.postgresql.base import PGDialect

from kenning.storage.tables import metadata

Sql = psycopg.Connection[tuple[Any, ...]]
ALEMBIC_TABLE = "kenning_alembic_version"

_MIGRATED_COLUMNS = """
    SELECT c.relname AS table_name, a.attname AS column_name,
           format_type(a.atttypid, a.atttypmod) AS type_name, NOT a.attnotnull AS nullable
    FROM pg_attribute AS a
    JOIN pg_class AS c ON c.oid = a.attrelid
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
      AND starts_with(c.relname, 'kenning_') AND c.relname <> %(alembic)s
      AND a.attnum > 0 AND NOT a.attisdropped
"""
_MIGRATED_PRIMARY_KEYS = """
    SELECT c.relname AS table_name,
           array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum)) AS columns
    FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indrelid
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
    WHERE i.indisprimary AND n.nspname = current_schema()
      AND starts_with(c.relname, 'kenning_') AND c.relname <> %(alembic)s
    GROUP BY c.relname
"""

Columns = dict[tuple[str, str], tuple[str, bool]]  # (table, column) -> (type, nullable)


def _declared_tables() -> list[Table]:
    return list(metadata.sorted_tables)


def declared_columns() -> Columns:
    dialect = PGDialect()  # type: ignore[no-untyped-call]
    return {
        (table.name, column.name): (column.type.compile(dialect=dialect).lower(), bool(column.nullable))
        for table in _declared_tables()
        for column in table.columns
    }


def migrated_columns(sql: Sql) -> Columns:
    with sql.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(_MIGRATED_COLUMNS, {"alembic": ALEMBIC_TABLE}).fetchall()
    return {(row["table_name"], row["column_name"]): (row["type_name"], row["nullable"]) for row in rows}


def _difference(declared: Columns, migrated: Columns) -> list[str]:
    problems = []
    for key in sorted(declared.keys() | migrated.keys()):
        where = ".".join(key)
        if key not in migrated:
            problems.append(f"{where}: in tables.py, not in the migrated database")
        elif key not in declared:
            problems.append(f"{where}: in the migrated database, not in tables.py")
        elif declared[key] != migrated[key]:
            problems.append(f"{where}: tables.py says (type, nullable) {declared[key]}, the database {migrated[key]}")
    return problems


def test_the_module_declares_exactly_the_migrated_tables(sql: Sql) -> None:
    migrated = {table for table, _ in migrated_columns(sql)}
    assert {table.name for table in _declared_tables()} == migrated


def test_every_column_has_the_migrated_type_and_nullability(sql: Sql) -> None:
    problems = _difference(declared_columns(), migrated_columns(sql))
    assert problems == [], "\n".join(problems)


def test_every_table_has_the_migrated_primary_key(sql: Sql) -> None:
    with sql.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(_MIGRATED_PRIMARY_KEYS, {"alembic": ALEMBIC_TABLE}).fetchall()
    migrated = {row["table_name"]: list(row["columns"]) for row in rows}
    declared = {table.name: [c.name for c in table.primary_key.columns] for table in _declared_tables()}
    assert declared == migrated


def test_the_comparison_names_each_kind_of_drift() -> None:
    declared = {("t", "a"): ("text", False), ("t", "b"): ("jsonb", True), ("t", "c"): ("uuid", True)}
    migrated = {("t", "a"): ("text", True), ("t", "b"): ("jsonb", True), ("t", "d"): ("bigint", False)}
    assert _difference(declared, migrated) == [
        "t.a: tables.py says (type, nullable) ('text', False), the database ('text', True)",
        "t.c: in tables.py, not in the migrated database",
        "t.d: in the migrated database, not in tables.py",
    ]
