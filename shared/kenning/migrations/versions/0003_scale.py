"""Storage tuned for large tables (issue 15): autovacuum of the hot tables by an absolute
count of dead rows instead of a share of the table.

PostgreSQL's default starts a table's autovacuum once 50 rows + 20 % of the table are dead.
Finished instances, processed events and published messages stay for their retention
period, so with the default the dead row versions a table carries between vacuums (and the
dead entries in its partial indexes: the claim's, the inbox's and the relayer's queues)
grow with the rows retained: 220,000 in kenning_instances with 1M finished instances,
where an empty table is vacuumed after 50. With a fixed count a vacuum comes after the same
amount of work whatever the table holds, and it stays cheap on a large table: its
unchanged pages are all-visible and skipped, and index vacuuming is bypassed while the dead
rows sit on under 2 % of the pages (PostgreSQL 14+).

What was measured and left alone (docs/performance.md, "Scale"):
- fillfactor: no update of an instance row is HOT (``n_tup_hot_upd`` stays 0), since the
  claim, heartbeat, suspend and completion each change available_at, status or lease_token,
  which the claimable and lease indexes cover; free space kept on each page would buy
  nothing.
- statistics targets: the statements are single-row lookups by key or ordered ranges of
  partial indexes; their plans do not change between the empty and the loaded tables.
- partial indexes: the claim reads only kenning_instances_claimable, whose entries are
  runnable instances; no statement of the worker's hot path reads finished rows.

Revision ID: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Tables whose rows are updated or deleted while they are live (claims, leases, processing,
# deletion of fired timers and met subscriptions): vacuumed after 10,000 dead rows, about
# 5,000 three-step workflows (claim and completion each leave one dead version).
CHURNED = ("kenning_instances", "kenning_inbox", "kenning_outbox", "kenning_timers", "kenning_event_subscriptions")
CHURNED_OPTIONS = "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000"

# The history only grows until retention deletes it: the rows retention deletes are
# reclaimed, and new rows marked all-visible, after a fixed count too.
HISTORY_OPTIONS = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100000, "
    "autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 100000"
)

RESET_OPTIONS = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold"
)


def upgrade() -> None:
    for table in CHURNED:
        op.execute(f"ALTER TABLE {table} SET ({CHURNED_OPTIONS})")
    op.execute(f"ALTER TABLE kenning_history SET ({HISTORY_OPTIONS})")


def downgrade() -> None:
    for table in (*CHURNED, "kenning_history"):
        op.execute(f"ALTER TABLE {table} RESET ({RESET_OPTIONS})")
