"""Who receives each event type, across every version of the app a fleet runs (issue 25).

- ``kenning_event_receivers``: one row per (event type, kind, name) that a worker's app
  declares: ``workflow`` for an ``event_handler`` workflow, ``handler`` for an
  ``on_event`` handler. Each worker with an inbox loop declares its own at start and
  renews ``last_seen`` while it runs. A worker claims an inbox event only if it has every
  receiver declared for its type within the receiver time-to-live: during a rolling
  deploy an event is processed by a worker that knows all of them, or waits for one,
  never marked processed by a worker that would skip a receiver it lacks.
- ``kenning_inbox.no_receiver``: true for an event that, when processed, had nothing to
  receive it (no handler, no workflow started, no waiting instance). Edda calls such an
  event processed too; Kenning keeps it so and shows it. A constant default changes
  only the catalog (PostgreSQL 11 and later): no rewrite of a large inbox.

Revision ID: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_event_receivers (
    event_type text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('workflow', 'handler')),
    name text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, kind, name)
);
ALTER TABLE kenning_inbox ADD COLUMN IF NOT EXISTS no_receiver boolean NOT NULL DEFAULT false;
"""

DOWNGRADE = """
ALTER TABLE kenning_inbox DROP COLUMN IF EXISTS no_receiver;
DROP TABLE IF EXISTS kenning_event_receivers;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
