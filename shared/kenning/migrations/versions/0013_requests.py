"""Long-running workflows (issue 29): requests with a reply (``Client.request``).

``kenning_replies``: the reply a workflow made to a message of its mailbox
(``message.reply`` / ``reply_error``), one per (instance, message id): ``value`` (JSON) or
``error`` (the workflow's reason for refusing), written by the worker in the transaction
that records the replying step (``kenning.storage.replies``), read by the client waiting
in ``Client.request``; deleted with its instance by retention.

A new, empty table: no existing table is rewritten, scanned or locked beyond the catalog,
so the migration costs the same on a database of any size.

Revision ID: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_replies (
    instance_id text NOT NULL,
    message_id  text NOT NULL,
    value       jsonb,
    error       text,
    replied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, message_id)
);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_replies;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
