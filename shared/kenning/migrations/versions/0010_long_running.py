"""Long-running workflows (issue 29): the workflow timeout's deadline.

``kenning_instances.deadline_at``: when a ``@workflow(timeout=...)`` (or a start's
``timeout=``) runs out, NULL for none; the scheduler fires due deadlines
(``kenning.storage.deadlines``) through the partial index ``kenning_instances_deadline``
over the unfinished instances that have one.

A nullable column without a default is a catalog change (no rewrite). Alembic runs each
migration in a transaction, where ``CREATE INDEX CONCURRENTLY`` is impossible: the index is
built in the transaction, scanning ``kenning_instances`` once under a SHARE lock (writes
wait for the scan, reads go on); no existing row matches its predicate, so the index
itself starts empty. Measured at 1 million instances: docs/performance.md.

Revision ID: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_instances ADD COLUMN IF NOT EXISTS deadline_at timestamptz;
CREATE INDEX IF NOT EXISTS kenning_instances_deadline ON kenning_instances (deadline_at)
    WHERE deadline_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');
"""

DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_deadline;
ALTER TABLE kenning_instances DROP COLUMN IF EXISTS deadline_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
