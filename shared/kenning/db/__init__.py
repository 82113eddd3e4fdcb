"""The database layer: connections and statements (``connection``: one psycopg pool per
process, ``statement``, ``Executor``), the pool's cancellable upkeep (``pool``), what a
database error means (``errors``), group commit, LISTEN connections and migrations.

Internal to Kenning: the public API is ``kenning``'s top-level modules. Imports only
``kenning.core``, ``kenning.errors`` and ``kenning.observability``; all SQL is in
``kenning.storage``, above it.
"""

from kenning.db.connection import (
    PGBOUNCER_MODES,
    Database,
    Executor,
    Statement,
    connect,
    executor_of,
    statement,
)

__all__ = ["PGBOUNCER_MODES", "Database", "Executor", "Statement", "connect", "executor_of", "statement"]
