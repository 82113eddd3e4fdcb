"""Transitional names for code not yet moved to ``kenning.db`` (deleted once nothing
imports it): the hand-written pool it held is replaced by ``kenning.db.Database``."""

from __future__ import annotations

from sqlalchemy.sql.elements import TextClause

from kenning.db import Connection, Statement, _psycopg_sql

Executor = Connection


def compiled_sql(clause: Statement | TextClause) -> str:
    """``clause`` as psycopg runs it (``%(name)s`` parameters)."""
    return _psycopg_sql(clause)
