"""Flow control per key (issue 35): ``kenning_bursts``, the debounced bursts and event batches.

One row per burst or batch: its instance (an ordinary ``pending`` row, its run-after time
the burst's due time), the workflow and key it folds starts or events of, how many it
folded, and for a batch the inbox ids of its events (their order). Deleted with its
instance (retention). The key's newest burst is found through
``kenning_bursts_key`` (``kenning/storage/flow.py``).

Revision ID: 0021
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0025"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_bursts (
    instance_id text PRIMARY KEY REFERENCES kenning_instances (id) ON DELETE CASCADE,
    kind text NOT NULL CHECK (kind IN ('debounce', 'batch')),
    workflow_name text NOT NULL,
    flow_key text NOT NULL,
    opened_at timestamptz NOT NULL DEFAULT now(),
    last_at timestamptz NOT NULL DEFAULT now(),
    folded integer NOT NULL DEFAULT 1,
    period_seconds double precision,
    max_wait_seconds double precision,
    max_size integer,
    seqs bigint[]
);
CREATE INDEX IF NOT EXISTS kenning_bursts_key ON kenning_bursts (workflow_name, flow_key, kind, opened_at DESC);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_bursts;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
