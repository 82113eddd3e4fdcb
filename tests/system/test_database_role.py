"""Kenning runs as a plain database owner, as compose deploys it: the role that
``deploy/postgres-init`` creates (LOGIN, owner of its database, no superuser) migrates the
schema, runs a workflow through a worker and takes events through the ingress."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from kenning import Client
from kenning.hosting.embedded import with_database
from tests.ingress_support import binary, cloud_event, start_ingress
from tests.support import REPO_ROOT, ProcessPool, kenning_command

INIT_SCRIPT = REPO_ROOT / "deploy" / "postgres-init" / "10-kenning-role.sh"


def init_statements(role: str, password: str) -> list[str]:
    """The SQL of compose's init script, for a role and database named ``role``."""
    script = INIT_SCRIPT.read_text()
    match = re.search(r"<<'SQL'\n(.*?)\nSQL\n", script, re.S)
    assert match, "the init script feeds psql a heredoc named SQL"
    sql = re.sub(r"\bkenning\b", role, match.group(1)).replace(":'password'", f"'{password}'")
    return [statement.strip() for statement in sql.split(";") if statement.strip()]


@pytest.fixture
def plain_owner_url(pg_server_url: str) -> Iterator[str]:
    role = f"kenning_plain_{uuid.uuid4().hex[:10]}"
    admin_url = with_database(pg_server_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for statement in init_statements(role, "plain-pw"):
            admin.execute(statement)  # CREATE DATABASE refuses a transaction: one at a time
    try:
        url = make_url(pg_server_url).set(username=role, password="plain-pw", database=role)
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{role}" WITH (FORCE)')
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


async def test_kenning_migrates_and_runs_as_a_plain_database_owner(
    plain_owner_url: str, processes: ProcessPool
) -> None:
    with psycopg.connect(plain_owner_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolsuper AS superuser, rolcreatedb AS createdb, rolcreaterole AS createrole "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False)

    migrated = kenning_command("migrate", url=plain_owner_url)
    assert migrated.returncode == 0, migrated.stderr

    processes.worker(plain_owner_url, "tests.apps.core")
    async with Client(plain_owner_url) as client:
        started = await client.start("three_steps", value=4)
        assert await client.result(started.instance_id, timeout=30) == 7

    ingress = start_ingress(processes, plain_owner_url)
    headers, body = binary(cloud_event("plain.owner", {"a": 1}))
    async with httpx.AsyncClient(base_url=ingress.url, timeout=10) as http:
        assert (await http.post("/", headers=headers, content=body)).status_code == 202
        assert (await http.get("/readyz")).json() == {"status": "ready"}
