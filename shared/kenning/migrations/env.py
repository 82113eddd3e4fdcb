"""Alembic environment: runs on the connection ``kenning.db.migrate`` hands over."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table="kenning_alembic_version", transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
