"""A database not encoded in UTF8 (a SQL_ASCII one: what ``initdb`` makes without a
locale, as pg_auto_failover's ``pg_autoctl create`` does in a bare environment) is refused
by ``kenning migrate`` in one line that says what to do, not with a driver's TypeError."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from kenning.hosting.embedded import with_database
from tests.support import kenning_command


@pytest.fixture
def sql_ascii_database_url(pg_server_url: str) -> Iterator[str]:
    name = f"kenning_ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(with_database(pg_server_url, "postgres"), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    yield with_database(pg_server_url, name)
    with psycopg.connect(with_database(pg_server_url, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_refuses_a_database_not_in_utf8_in_one_line(sql_ascii_database_url: str) -> None:
    refused = kenning_command("migrate", url=sql_ascii_database_url)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "SQL_ASCII" in lines[0] and "UTF8" in lines[0], lines[0]
    with psycopg.connect(sql_ascii_database_url) as sql:
        assert sql.execute("SELECT to_regclass('kenning_instances')").fetchone() == (None,)  # nothing made
