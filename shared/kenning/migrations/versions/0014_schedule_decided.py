"""A schedule's last decision time (issue 33): ``kenning_schedules.decided_at``.

The database clock when a scheduler last decided one of the schedule's ticks. A scheduler
that starts counts the ticks due up to a minute after it as seen by a scheduler then
running (it may be stopped, or the database away), and starts each late; only ticks
further from every scheduler's watch collapse into one run of the latest
(``kenning_scheduler/cron_ticks.py``).

A nullable column added without a default: PostgreSQL changes only the catalog, so the
migration costs the same on a table of any size and locks it for a moment.

Revision ID: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_schedules ADD COLUMN IF NOT EXISTS decided_at timestamptz;
"""

DOWNGRADE = """
ALTER TABLE kenning_schedules DROP COLUMN IF EXISTS decided_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
