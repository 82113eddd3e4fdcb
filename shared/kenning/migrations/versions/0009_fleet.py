"""Operating a fleet (issue 28): who is running, what operators did, the schedules.

- ``kenning_processes``: every process (worker, scheduler, relayer, ingress, console)
  registers at start and heartbeats ``last_seen``; an entry whose ``last_seen`` is older
  than its expiry is stale (shown so, then deleted by the scheduler). ``details`` holds
  what the process says of itself (a worker's workflows, queues, concurrency, how busy).
- ``kenning_operator_actions``: every operator action, single or bulk, from the CLI or the
  console: what, when, from where (``origin``, ``actor``), on what (``target`` or the
  bulk ``filter``), how many rows it changed, and why (``reason``).
- ``kenning_schedules``: one row per cron schedule a scheduler knows (written by the
  schedulers from the workflows' ``@workflow(schedule=...)``): its expression and time
  zone, whether it is paused, its overlap policy, the last tick decided (started, or
  skipped: paused, overlapping, before the schedule was first seen) and the next due, and
  the instance it last started (``last_instance_id``: the overlap policy reads that one
  row by its key instead of the workflow's whole history).

New tables and no change to existing ones: nothing is rewritten or locked for long.

Revision ID: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_processes (
    id          text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('worker', 'scheduler', 'relayer', 'ingress', 'console')),
    host        text NOT NULL,
    pid         integer NOT NULL,
    version     text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    expires_after_seconds double precision NOT NULL DEFAULT 60,
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS kenning_processes_last_seen ON kenning_processes (last_seen);
CREATE TABLE IF NOT EXISTS kenning_operator_actions (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    action    text NOT NULL,
    origin    text NOT NULL CHECK (origin IN ('cli', 'console', 'api')),
    actor     text NOT NULL DEFAULT '',
    target    text,
    filter    jsonb,
    affected  integer NOT NULL DEFAULT 0,
    reason    text,
    details   jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS kenning_operator_actions_at ON kenning_operator_actions (at);
CREATE INDEX IF NOT EXISTS kenning_operator_actions_target ON kenning_operator_actions (target)
    WHERE target IS NOT NULL;
CREATE TABLE IF NOT EXISTS kenning_schedules (
    workflow_name text PRIMARY KEY,
    expression    text NOT NULL,
    timezone      text NOT NULL DEFAULT 'UTC',
    paused        boolean NOT NULL DEFAULT false,
    paused_reason text,
    overlap       text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('skip', 'buffer_one', 'allow')),
    last_tick     timestamptz,
    next_tick     timestamptz,
    last_instance_id text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_schedules;
DROP TABLE IF EXISTS kenning_operator_actions;
DROP TABLE IF EXISTS kenning_processes;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
