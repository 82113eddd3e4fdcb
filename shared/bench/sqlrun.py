"""Plain psycopg helpers for the benchmark's limits: no Kenning code in the measured loop."""

from __future__ import annotations

import re

from sqlalchemy.sql.elements import TextClause

_PARAM = re.compile(r"(?<![:\w]):(\w+)")


def psycopg_sql(statement: TextClause) -> str:
    """Kenning's own statement text with ``:name`` turned into psycopg's ``%(name)s``."""
    return _PARAM.sub(r"%(\1)s", str(statement).replace("%", "%%"))
