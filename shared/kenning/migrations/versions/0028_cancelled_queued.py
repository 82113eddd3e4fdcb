"""A queued instance asked to cancel is claimed outside its queue's limits (issue 38,
item 4): the plain claim takes it through ``kenning_instances_queued_cancelled``, an index
of the queues' runnable instances whose cancel was requested (none but those compensating),
so the claim never reads a queue's backlog to find them.

Built in the migration's one transaction (``kenning/db/migrate.py``: no CONCURRENTLY there),
scanning ``kenning_instances`` once under a SHARE lock: writes wait for the scan, reads go on.

Revision ID: 0028
"""

from __future__ import annotations

from alembic import op

revision = "0028"
down_revision = "0021"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE INDEX IF NOT EXISTS kenning_instances_queued_cancelled ON kenning_instances (available_at)
    WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL AND cancel_requested;
"""

DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_queued_cancelled;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
