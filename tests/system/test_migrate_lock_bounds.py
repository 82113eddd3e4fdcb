"""A migration waits a bounded time for a table's lock (``kenning.db.bounds.MigrationBounds``),
through the real ``kenning migrate``.

The schema starts one revision before head; the head migration alters ``kenning_instances``
(the test says so if it stops doing that). An outside session holds a lock on that table
inside an open transaction, as a long report or a stuck client does. Unbounded, the
migration's lock request waits for ever, and every later statement on the table queues
behind it: here another session's write would find itself waiting until its own 2 s
bound, far longer than the migration's 0.5 s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kenning.db.migrate import _config, current_revision, head_revision
from tests import logguard
from tests.support import REPO_ROOT

# the other session's own bound: a write still waiting this long was held up by the
# migration's lock request for far longer than the migration's 0.5 s lock timeout
WRITER_LOCK_TIMEOUT = "2s"


def previous_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_revision(head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


def downgrade_to(database_url: str, revision: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from kenning.core.database_urls import sync_url

    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            config = _config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
            connection.commit()
    finally:
        engine.dispose()


@pytest.fixture
def previous_url(database_url: str) -> str:
    downgrade_to(database_url, previous_revision())
    assert current_revision(database_url) == previous_revision()
    return database_url


@pytest.fixture
def holder(previous_url: str) -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """An outside session with an open transaction holding a write lock on the table."""
    with psycopg.connect(previous_url) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        conn.execute("LOCK TABLE kenning_instances IN ROW EXCLUSIVE MODE")
        yield conn, pid
        conn.rollback()


def start_migrate(database_url: str, lock_timeout: str, retries: str) -> subprocess.Popen[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
        "KENNING_LOG_FORMAT": "json",
        "KENNING_DATABASE_URL": database_url,
        "KENNING_MIGRATE_LOCK_TIMEOUT": lock_timeout,
        "KENNING_MIGRATE_LOCK_RETRIES": retries,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "kenning", "migrate"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(migrate: subprocess.Popen[str]) -> tuple[int, str]:
    stdout, stderr = migrate.communicate(timeout=60)
    guard = logguard.current()
    if guard is not None:
        guard.watch_text("kenning migrate", stdout + "\n" + stderr)
    return migrate.returncode, stderr


def waiting_for(conn: psycopg.Connection[Any], holder_pid: int) -> bool:
    """A session (the migration's) waits for the holder's lock."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,)
    ).fetchone()
    return bool(row and row[0])


def test_a_blocked_migration_gives_up_naming_the_holder_and_never_stalls_the_table(
    previous_url: str, holder: tuple[psycopg.Connection[Any], int]
) -> None:
    _, holder_pid = holder
    migrate = start_migrate(previous_url, lock_timeout="0.5", retries="2")
    writes, stalled, saw_the_wait = 0, [], False
    try:
        with psycopg.connect(previous_url, autocommit=True) as writer:
            writer.execute(f"SET lock_timeout = '{WRITER_LOCK_TIMEOUT}'")
            deadline = time.monotonic() + 60
            while migrate.poll() is None and time.monotonic() < deadline:
                saw_the_wait = saw_the_wait or waiting_for(writer, holder_pid)
                try:
                    # ROW EXCLUSIVE: queued behind the migration's lock request while it waits
                    writer.execute("UPDATE kenning_instances SET priority = priority WHERE id = 'none'")
                    writes += 1
                except psycopg.errors.LockNotAvailable as error:
                    stalled.append(str(error).strip())
                    break
                time.sleep(0.05)
    finally:
        if migrate.poll() is None:
            migrate.kill()
    code, stderr = finished(migrate)
    assert stalled == [], f"another session's write waited {WRITER_LOCK_TIMEOUT} behind the migration"
    assert saw_the_wait, "the migration never waited for the holder: does the head migration still alter the table?"
    assert writes > 0
    assert code == 2, stderr
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("kenning migrate: migration gave up after 3 waits of 0.5 s for a lock on kenning_instances")
    assert f"pid {holder_pid} (idle in transaction" in line, line
    assert "KENNING_MIGRATE_LOCK_TIMEOUT" in line
    assert current_revision(previous_url) == previous_revision()  # nothing of it committed


def test_a_migration_blocked_for_a_while_goes_through_once_the_lock_is_released(
    previous_url: str, holder: tuple[psycopg.Connection[Any], int]
) -> None:
    conn, holder_pid = holder
    migrate = start_migrate(previous_url, lock_timeout="0.5", retries="5")
    try:
        with psycopg.connect(previous_url, autocommit=True) as watcher:
            deadline = time.monotonic() + 30
            while not waiting_for(watcher, holder_pid):
                assert migrate.poll() is None and time.monotonic() < deadline, "the migration never waited"
                time.sleep(0.05)
        conn.commit()  # the lock released: a retry goes through
    except BaseException:
        migrate.kill()
        raise
    code, stderr = finished(migrate)
    assert code == 0, stderr
    assert current_revision(previous_url) == head_revision()
