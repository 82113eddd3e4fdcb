"""The console's list (``kenning console``, ``kenning.storage.console``): an index per
filter it narrows by, both in the list's order (newest first, ties by id).

- ``kenning_instances_status_created``: one status's instances, newest first, and the
  counts by status (an index-only range per status, counted up to a cap). Without it a
  status with few rows (``compensating``, or ``failed`` on a healthy system) costs a walk
  over every instance: 270 ms for an empty page, 3.7 s for the counts, with 1M instances.
- ``kenning_instances_workflow_status_created``: one workflow's instances of one status,
  newest first, and that workflow's counts by status; one workflow's instances of any
  status are the ranges of every status merged (265 ms for a workflow with no rows
  without it, 4 s for its counts with ``(workflow_name, created_at)`` instead).

**Status and workflow are keyed under ``COLLATE "C"``, so only the console uses them.**
PostgreSQL matches a comparison to an index column only when both have the same
collation; the console's statements compare ``status COLLATE "C"`` and
``workflow_name COLLATE "C"``, every other statement the plain columns (the database's
default collation), so no other statement can use these two indexes. That is the point:
keyed on the plain columns, the worker's claim (``status IN (...) AND workflow_name =
ANY(:names) ... ORDER BY available_at LIMIT n``) matched the workflow index too, and the
planner took it whenever its statistics said the claimed workflows had few runnable rows
(an empty table, or a backlog started since the last ANALYZE): that plan reads and sorts
the workflow's whole backlog: 1.5 s per claim over a 1M-instance backlog against 2 ms
on ``kenning_instances_claimable``. The queued claim, the stuck check and the metrics
name the same columns and were exposed alike. Equality is byte equality under either
collation (the default collation is deterministic), so a list filter finds the same
rows; only the order of status and workflow values inside the index differs, which no
query asks for. The other ways out were weaker: partial indexes without the runnable
statuses leave the runnable statuses' pages (a backlog's) without an index in the
list's order, and one for them the claim could use again; a reordered key still
matches the claim's columns; hints do not exist. Whether a plan may use these indexes
is decided by the statement's text, not by statistics.

The unfiltered list and the time range use ``kenning_instances_created`` (0001). Each
index is one more entry per inserted instance and per status change (a change of status is
never a HOT update: status is in the claim index's predicate). Measured with the bench's
throughput run (2 workers, 2,000 workflows, empty tables): the two indexes take 14 of the
42 buffer accesses per workflow spent on kenning_instances' indexes (7 each; the primary
key 12, the claimable index 3.5), and grow to 12 times the size of
``kenning_instances_created`` over the same rows (wider keys, and a status change defeats
deduplication); workflows/s with and without them did not differ beyond the noise of a
shared 2-core machine (4 alternating runs each).

Revision ID: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = """
-- COLLATE "C": only statements comparing under "C" (kenning/storage/console.py) can use
-- them; the claim, which names the plain columns, cannot (see above)
CREATE INDEX IF NOT EXISTS kenning_instances_status_created
    ON kenning_instances (status COLLATE "C", created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS kenning_instances_workflow_status_created
    ON kenning_instances (workflow_name COLLATE "C", status COLLATE "C", created_at DESC, id DESC);
"""

DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_workflow_status_created;
DROP INDEX IF EXISTS kenning_instances_status_created;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
