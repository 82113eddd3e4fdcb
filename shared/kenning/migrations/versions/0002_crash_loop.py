"""Crash loops: count the runs of an instance that ended without a clean end or a new step.

``runs_without_progress`` counts consecutive runs whose lease expired (the worker died or
stalled, or the run raised and was handed back as an expired lease) without a step
recorded since ``claimed_at``; the claim resets it when the previous run ended cleanly
(completion, suspend, shutdown or back-off release) or made progress, and parks the instance as failed
(``crash_loop``) instead of handing it out once it reaches the worker's ``--max-runs``.

Revision ID: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_instances
    ADD COLUMN IF NOT EXISTS runs_without_progress integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS claimed_at timestamptz;
"""

DOWNGRADE = """
ALTER TABLE kenning_instances
    DROP COLUMN IF EXISTS runs_without_progress,
    DROP COLUMN IF EXISTS claimed_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
