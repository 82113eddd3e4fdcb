"""Per-key strategies and rate limits of a queue (issue 35): columns of ``kenning_queues``.

- ``partition_strategy``: what a start does when its partition key is at its limit
  (``wait``, ``cancel_newest``, ``cancel_in_progress``, ``singleton``; kenning/queues.py),
  read by the start (``kenning/storage/strategies.py``), which counts a key's unfinished
  instances through ``kenning_instances_queue_key_open``;
- ``key_rate_limit``/``key_rate_period_seconds``: at most that many starts per period for
  each partition key, enforced by the queued claim, which counts a key's starts in its
  window through ``kenning_instances_queue_key_started``.

Columns with a constant default change only the catalog. The indexes are built in the
migration's one transaction (``kenning/db/migrate.py``: no CONCURRENTLY there), scanning
``kenning_instances`` once under a SHARE lock: writes wait for the scan, reads go on.

Revision ID: 0022
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_queues ADD COLUMN IF NOT EXISTS partition_strategy text NOT NULL DEFAULT 'wait'
    CHECK (partition_strategy IN ('wait', 'cancel_newest', 'cancel_in_progress', 'singleton'));
ALTER TABLE kenning_queues ADD COLUMN IF NOT EXISTS key_rate_limit integer CHECK (key_rate_limit > 0);
ALTER TABLE kenning_queues ADD COLUMN IF NOT EXISTS key_rate_period_seconds double precision
    CHECK (key_rate_period_seconds > 0);

-- a key's unfinished instances, oldest first: what a strategy counts and cancels
CREATE INDEX IF NOT EXISTS kenning_instances_queue_key_open
    ON kenning_instances (queue_name, partition_key, created_at)
    WHERE queue_name IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');
-- a key's rate window: its starts (first claims) by time
CREATE INDEX IF NOT EXISTS kenning_instances_queue_key_started
    ON kenning_instances (queue_name, partition_key, started_at)
    WHERE queue_name IS NOT NULL AND started_at IS NOT NULL;
"""

DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_queue_key_started;
DROP INDEX IF EXISTS kenning_instances_queue_key_open;
ALTER TABLE kenning_queues DROP COLUMN IF EXISTS key_rate_period_seconds;
ALTER TABLE kenning_queues DROP COLUMN IF EXISTS key_rate_limit;
ALTER TABLE kenning_queues DROP COLUMN IF EXISTS partition_strategy;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
