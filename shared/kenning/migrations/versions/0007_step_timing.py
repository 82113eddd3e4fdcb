"""A step's attempts, start and run time, on its history row: the console's timeline
shows each step's start, duration and attempts (issue 18) without guessing them.

- ``attempts``: the last attempt's number: the failed attempts counted on the instance
  before it (in this claim or an earlier one) plus one. An attempt a crash or a lost
  lease cut short was never counted, so it can be fewer than the times the code ran.
- ``started_at``: when the last attempt began, on the worker's clock. Not derived from
  ``created_at`` (the database's clock): a record can be written well after its step
  ended (a deferred record goes with the next statement), and an activity's
  ``ctx.session`` transaction, whose ``now()`` a record would take, begins during it.
- ``run_seconds``: how long the last attempt ran, measured in the worker with a
  monotonic clock (a wall-clock step does not change it).

All three are NULL for what does not run (events, timers, markers, messages) and for
steps recorded before this migration: the console then falls back to the record
before the step. Nullable columns without a default change only the catalog: no table
rewrite, no long lock on a large history.

Revision ID: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_history
    ADD COLUMN IF NOT EXISTS attempts integer,
    ADD COLUMN IF NOT EXISTS started_at timestamptz,
    ADD COLUMN IF NOT EXISTS run_seconds double precision;
"""

DOWNGRADE = """
ALTER TABLE kenning_history
    DROP COLUMN IF EXISTS run_seconds,
    DROP COLUMN IF EXISTS started_at,
    DROP COLUMN IF EXISTS attempts;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
