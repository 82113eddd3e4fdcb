"""Schema migrations, safe to run from any number of processes at once, straight to
PostgreSQL or through pgbouncer in transaction mode.

The whole upgrade is one transaction (Alembic's ``transactional_ddl``), and the lock that
lets one process migrate at a time is a transaction-level advisory lock taken first in
it: a pooler in transaction mode keeps that transaction on one server connection, where
a session-level lock taken in one transaction and released in another would be taken
and released on different server connections (and stay held). A migration that needs
``autocommit_block()`` (``CREATE INDEX CONCURRENTLY``) would end that transaction, and
the lock with it: write it as a separate step.

Every wait for a table's lock is bounded (``MigrationBounds``): a DDL statement waiting
behind a long transaction would otherwise wait for ever, and every later statement on the
table would queue behind its request. When the bound runs out the whole upgrade rolls
back and is tried again after a back-off; after the last retry it gives up with
``MigrationBlockedError`` naming the table and the session that held it (found while the
migration waited: once the wait has ended, ``pg_blocking_pids`` no longer tells). The
advisory lock is taken before the bound is set: waiting for another process's migration
holds no table lock, so it is waited for unbounded.

Alembic and SQLAlchemy are imported by the functions that use them, not with this
module: every service imports ``migrate`` to run it at start, and one started with
``--no-migrate`` (a fleet whose schema a release job migrates) would otherwise pay their
import, about 0.4 s of CPU, most of its start.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from kenning.core.database_urls import sync_url
from kenning.db.bounds import MIGRATE_LOCK_FLAG, MIGRATE_RETRIES_FLAG, MigrationBounds
from kenning.db.errors import sqlstate
from kenning.errors import ConfigurationError, MigrationBlockedError

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy import Connection, Engine

_log = structlog.get_logger("kenning.migrate")

# Any constant works; every Kenning process agrees on it so only one migrates at a time.
MIGRATION_LOCK_KEY = 0x6B656E6E696E67  # "kenning"

# Statements prepared on a server connection are unknown on the next one a transaction
# pooler hands out; a migration runs each statement about once, so preparing gains nothing.
# UTF8 asked of the server: on a database that is not (SQL_ASCII) psycopg would hand text
# back as bytes, and SQLAlchemy fail reading the server's version before the check below.
_CONNECT_ARGS: dict[str, Any] = {"prepare_threshold": None, "client_encoding": "utf8"}


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent.parent / "migrations"))
    return config


def _engine(database_url: str) -> Engine:
    from sqlalchemy import create_engine

    return create_engine(sync_url(database_url), connect_args=_CONNECT_ARGS)


def _require_utf8(connection: Connection) -> None:
    """Refuse a database not encoded in UTF8: what Kenning stores (JSON, names, errors)
    is Unicode, and a SQL_ASCII database (``initdb`` without a locale) neither checks nor
    converts it."""
    from sqlalchemy import text

    encoding = connection.execute(text("SELECT current_setting('server_encoding')")).scalar_one()
    if encoding != "UTF8":
        name = connection.execute(text("SELECT current_database()")).scalar_one()
        raise ConfigurationError(
            f"database {name!r} is encoded {encoding}: Kenning needs UTF8 (CREATE DATABASE ... "
            "ENCODING 'UTF8' TEMPLATE template0, or a cluster made by initdb with a UTF-8 locale)"
        )


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


# lock_not_available: a lock_timeout ran out (or a NOWAIT found the lock taken)
_LOCK_TIMED_OUT = "55P03"

# who the migration waits for, read from another connection while it waits
_BLOCKERS = """
SELECT a.pid, coalesce(a.application_name, '') AS application, coalesce(a.state, '') AS state,
       coalesce(round(extract(epoch FROM now() - a.xact_start))::int, 0) AS transaction_seconds,
       coalesce((SELECT string_agg(DISTINCT c.relname, ', ') FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE l.pid = :waiter AND NOT l.granted), '') AS waits_for
FROM pg_stat_activity a
WHERE a.pid = ANY(pg_blocking_pids(:waiter))
ORDER BY a.pid
"""


class _BlockerWatch:
    """Reads, every ``interval`` seconds on a connection of its own, which sessions the
    migration's backend waits for; keeps the last answer that named one."""

    def __init__(self, engine: Engine, waiter: int, interval: float) -> None:
        self._engine, self._waiter, self._interval = engine, waiter, interval
        self._stop = threading.Event()
        self.seen = ""
        self._thread = threading.Thread(target=self._watch, name="kenning-migrate-blockers", daemon=True)

    def __enter__(self) -> _BlockerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        from sqlalchemy import text

        try:
            with self._engine.connect() as connection:
                while not self._stop.wait(self._interval):
                    rows = connection.execute(text(_BLOCKERS), {"waiter": self._waiter}).mappings().all()
                    connection.rollback()
                    if rows:
                        self.seen = _describe(rows)
        except Exception as error:  # the watch only words the error: the migration goes on
            _log.debug("schema.blocker_watch_failed", error=str(error))


def _describe(rows: Any) -> str:
    table = rows[0]["waits_for"] or "a table"
    holders = "; ".join(
        f"pid {r['pid']} ({r['state'] or 'no state'}, transaction open {r['transaction_seconds']} s"
        + (f", application {r['application']!r})" if r["application"] else ")")
        for r in rows
    )
    return f"{table} held by {holders}"


def _upgrade(engine: Engine, bounds: MigrationBounds) -> tuple[str | None, str]:
    """One attempt, in one transaction: (the revision before, the head)."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import text

    with engine.connect() as connection:
        _require_utf8(connection)
        connection.rollback()
        # begins the upgrade's transaction; Alembic runs in it (an external transaction).
        # Not bounded: it waits for another process's migration, holding no table lock.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        for name, value in bounds.session().items():
            connection.execute(text("SELECT set_config(:name, :value, true)"), {"name": name, "value": value})
        before = MigrationContext.configure(
            connection, opts={"version_table": "kenning_alembic_version"}
        ).get_current_revision()
        config = _config()
        config.attributes["connection"] = connection
        waiter = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with _BlockerWatch(engine, waiter, max(0.05, min(0.5, bounds.lock / 4))) as watch:
            try:
                command.upgrade(config, "head")
            except Exception as error:
                if sqlstate(error) == _LOCK_TIMED_OUT:
                    raise _LockWaitError(watch.seen or "a table held by a session not seen") from error
                raise
        connection.commit()  # releases the lock
        return before, head_revision()


class _LockWaitError(Exception):
    """One attempt's lock wait ran out; ``str`` names the table and who held it."""


def migrate(database_url: str, bounds: MigrationBounds | None = None) -> str:
    """Bring the schema to the newest revision; returns it. Idempotent and concurrency-safe.
    ``bounds``: the lock waits' (default: the ``KENNING_MIGRATE_*`` variables')."""
    bounds = MigrationBounds.from_environment() if bounds is None else bounds
    engine = _engine(database_url)
    try:
        attempt = 0
        while True:
            try:
                before, after = _upgrade(engine, bounds)
                break
            except _LockWaitError as ended:
                if attempt >= bounds.retries:
                    raise MigrationBlockedError(
                        f"migration gave up after {attempt + 1} waits of {bounds.lock:g} s for a lock on {ended} "
                        f"(nothing was changed; end that transaction, or raise {_variables()})"
                    ) from ended.__cause__
                delay = bounds.backoff(attempt)
                _log.warning("schema.migration_blocked", attempt=attempt + 1, blocked_by=str(ended), retry_in=delay)
                time.sleep(delay)
                attempt += 1
        if before != after:
            _log.info("schema.migrated", from_revision=before, to_revision=after)
        return after
    finally:
        engine.dispose()


def _variables() -> str:
    from kenning.core.names import env_name

    return f"{env_name(MIGRATE_LOCK_FLAG)} or {env_name(MIGRATE_RETRIES_FLAG)}"


def current_revision(database_url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = _engine(database_url)
    try:
        with engine.connect() as connection:
            _require_utf8(connection)
            return MigrationContext.configure(
                connection, opts={"version_table": "kenning_alembic_version"}
            ).get_current_revision()
    finally:
        engine.dispose()
