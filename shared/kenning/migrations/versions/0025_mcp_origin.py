"""``kenning mcp`` (issue 37): its actions are recorded in the operator action log with
origin ``mcp``, beside ``cli``, ``console`` and ``api``.

The CHECK is replaced ``NOT VALID`` (a brief lock, no scan while it is held), then
validated, which scans under a lock that lets reads and writes go on.

Revision ID: 0025
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_operator_actions
    DROP CONSTRAINT IF EXISTS kenning_operator_actions_origin_check,
    ADD CONSTRAINT kenning_operator_actions_origin_check
        CHECK (origin IN ('cli', 'console', 'api', 'mcp')) NOT VALID;
ALTER TABLE kenning_operator_actions VALIDATE CONSTRAINT kenning_operator_actions_origin_check;
"""

# the rows an MCP client recorded would break the narrower check: they are kept, as 'api'
DOWNGRADE = """
UPDATE kenning_operator_actions SET origin = 'api' WHERE origin = 'mcp';
ALTER TABLE kenning_operator_actions
    DROP CONSTRAINT IF EXISTS kenning_operator_actions_origin_check,
    ADD CONSTRAINT kenning_operator_actions_origin_check CHECK (origin IN ('cli', 'console', 'api'));
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
