"""Operations (issue 16): retention, the reason an instance has no way forward, trace
context. Each part's DDL is its own statement block below, so the parts can land apart.

Revision ID: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# ------------------------------------------------------------------ nothing stuck silently
# The scheduler's stuck check (kenning/storage/progress.py) records why an instance it found
# with no way forward could not be repaired (stuck_reason, cleared once it moves on), when it
# last found it so (stuck_at) and how often it repaired it (stuck_repairs: past a bound the
# repair is judged not to help). The waiting index lets the check find waiting instances
# without a timer or subscription without reading every finished row.
STUCK_UPGRADE = """
ALTER TABLE kenning_instances
    ADD COLUMN IF NOT EXISTS stuck_reason text,
    ADD COLUMN IF NOT EXISTS stuck_at timestamptz,
    ADD COLUMN IF NOT EXISTS stuck_repairs integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS kenning_instances_waiting ON kenning_instances (id)
    WHERE status IN ('waiting_for_timer', 'waiting_for_event');
CREATE INDEX IF NOT EXISTS kenning_instances_stuck ON kenning_instances (id)
    WHERE stuck_reason IS NOT NULL;
"""

STUCK_DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_stuck;
DROP INDEX IF EXISTS kenning_instances_waiting;
ALTER TABLE kenning_instances
    DROP COLUMN IF EXISTS stuck_reason,
    DROP COLUMN IF EXISTS stuck_at,
    DROP COLUMN IF EXISTS stuck_repairs;
"""

# ------------------------------------------------------------------ retention
# A workflow's retention (@workflow(retention=...)) travels with its definition row, so the
# scheduler applies it without the application's code (NULL: the scheduler's default). The
# finished index is the retention sweep's range per workflow, oldest finished first.
RETENTION_UPGRADE = """
ALTER TABLE kenning_workflow_definitions ADD COLUMN IF NOT EXISTS retention_seconds double precision;
CREATE INDEX IF NOT EXISTS kenning_instances_finished ON kenning_instances (workflow_name, finished_at)
    WHERE status IN ('completed', 'failed', 'cancelled');
"""

RETENTION_DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_finished;
ALTER TABLE kenning_workflow_definitions DROP COLUMN IF EXISTS retention_seconds;
"""

# ------------------------------------------------------------------ trace context
# The W3C trace context (kenning/observability/tracing.py's carrier: traceparent, tracestate, and origin,
# the trace the instance started in) of the start or of the delivery that last woke the
# instance: each claim reads it back, so a run after a worker crash continues the trace.
TRACE_UPGRADE = """
ALTER TABLE kenning_instances ADD COLUMN IF NOT EXISTS trace_context jsonb;
"""

TRACE_DOWNGRADE = """
ALTER TABLE kenning_instances DROP COLUMN IF EXISTS trace_context;
"""


def upgrade() -> None:
    op.execute(STUCK_UPGRADE)
    op.execute(RETENTION_UPGRADE)
    op.execute(TRACE_UPGRADE)


def downgrade() -> None:
    op.execute(TRACE_DOWNGRADE)
    op.execute(RETENTION_DOWNGRADE)
    op.execute(STUCK_DOWNGRADE)
