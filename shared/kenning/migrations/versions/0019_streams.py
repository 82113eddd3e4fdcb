"""Durable streams (issue 34): ``write_stream`` / ``close_stream`` / ``Client.read_stream``.

``kenning_streams``: one row per (instance, key), the stream's header: ``length`` (the
next entry's offset, so writers take offsets in turn under its row lock and a later
offset never commits before an earlier one), ``closed_at`` (``close_stream``, or the
instance's end, set in the transaction that ends it) and ``writers`` (per activity step,
the last attempt that wrote and the attempt number it was given, so an attempt abandoned
by a crashed worker and its retry never share a number).
``kenning_stream_entries``: the entries, by (instance, key, offset), each with the
attempt that wrote it (0: workflow code) and the step. Both go with their instance under
retention.

Two new, empty tables: catalog changes, no scan nor lock of an existing table.

Revision ID: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_streams (
    instance_id text NOT NULL,
    key         text NOT NULL,
    length      bigint NOT NULL DEFAULT 0,
    writers     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz,
    PRIMARY KEY (instance_id, key)
);
CREATE TABLE IF NOT EXISTS kenning_stream_entries (
    instance_id text NOT NULL,
    key         text NOT NULL,
    "offset"    bigint NOT NULL,
    attempt     integer NOT NULL,
    step_id     text,
    value       jsonb,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (instance_id, key, "offset")
);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_stream_entries;
DROP TABLE IF EXISTS kenning_streams;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
