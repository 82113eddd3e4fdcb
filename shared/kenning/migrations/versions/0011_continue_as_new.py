"""Long-running workflows (issue 29): reserved for continue as new; no change yet.

Revision ID: 0011
"""

from __future__ import annotations

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
