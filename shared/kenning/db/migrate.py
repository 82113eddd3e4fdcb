"""Schema migrations, safe to run from any number of processes at once, straight to
PostgreSQL or through pgbouncer in transaction mode.

The whole upgrade is one transaction (Alembic's ``transactional_ddl``), and the lock that
lets one process migrate at a time is a transaction-level advisory lock taken first in
it: a pooler in transaction mode keeps that transaction on one server connection, where
a session-level lock taken in one transaction and released in another would be taken
and released on different server connections (and stay held). A migration that needs
``autocommit_block()`` (``CREATE INDEX CONCURRENTLY``) would end that transaction, and
the lock with it: write it as a separate step.

Alembic and SQLAlchemy are imported by the functions that use them, not with this
module: every service imports ``migrate`` to run it at start, and one started with
``--no-migrate`` (a fleet whose schema a release job migrates) would otherwise pay their
import, about 0.4 s of CPU, most of its start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from kenning.core.database_urls import sync_url
from kenning.errors import ConfigurationError

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


def migrate(database_url: str) -> str:
    """Bring the schema to the newest revision; returns it. Idempotent and concurrency-safe."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import text

    engine = _engine(database_url)
    try:
        with engine.connect() as connection:
            _require_utf8(connection)
            connection.rollback()
            # begins the upgrade's transaction; Alembic runs in it (an external transaction)
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            before = MigrationContext.configure(
                connection, opts={"version_table": "kenning_alembic_version"}
            ).get_current_revision()
            config = _config()
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()  # releases the lock
            after = head_revision()
            if before != after:
                _log.info("schema.migrated", from_revision=before, to_revision=after)
            return after
    finally:
        engine.dispose()


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
