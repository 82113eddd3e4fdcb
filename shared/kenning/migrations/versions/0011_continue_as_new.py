"""Long-running workflows (issue 29): continue-as-new's run number and chain of runs.

``kenning_instances.run``: the run of the instance in progress (1 for the first);
``continue_as_new`` ends run N and makes run N+1 of the same instance in one statement
(``kenning.storage.runs``), keeping a summary of run N in ``kenning_instance_runs`` (its
input, when it began and ended, how many steps it recorded, how it ended) while its
history rows are deleted: the chain's history stays as short as one run's.

Cost on a big table: ``ADD COLUMN ... NOT NULL DEFAULT 1`` with a constant default is a
catalog change on PostgreSQL 11 and later (no table rewrite; rows read the default from
the catalog), taken under a brief ACCESS EXCLUSIVE lock; the new table starts empty.

Revision ID: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_instances ADD COLUMN IF NOT EXISTS run integer NOT NULL DEFAULT 1;
CREATE TABLE IF NOT EXISTS kenning_instance_runs (
    instance_id text NOT NULL,
    run integer NOT NULL,
    input jsonb NOT NULL,
    started_at timestamptz,
    ended_at timestamptz NOT NULL,
    steps integer NOT NULL,
    ended text NOT NULL,
    PRIMARY KEY (instance_id, run)
);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_instance_runs;
ALTER TABLE kenning_instances DROP COLUMN IF EXISTS run;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
