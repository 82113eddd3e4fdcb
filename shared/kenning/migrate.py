"""Schema migrations, safe to run from any number of processes at once."""

from __future__ import annotations

from pathlib import Path

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from kenning.db import sync_url

_log = structlog.get_logger("kenning.migrate")

# Any constant works; every Kenning process agrees on it so only one migrates at a time.
MIGRATION_LOCK_KEY = 0x6B656E6E696E67  # "kenning"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def migrate(database_url: str) -> str:
    """Bring the schema to the newest revision; returns it. Idempotent and concurrency-safe."""
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                before = MigrationContext.configure(
                    connection, opts={"version_table": "kenning_alembic_version"}
                ).get_current_revision()
                config = _config()
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                connection.commit()
                after = head_revision()
                if before != after:
                    _log.info("schema.migrated", from_revision=before, to_revision=after)
                return after
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                connection.commit()
    finally:
        engine.dispose()


def current_revision(database_url: str) -> str | None:
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(
                connection, opts={"version_table": "kenning_alembic_version"}
            ).get_current_revision()
    finally:
        engine.dispose()
