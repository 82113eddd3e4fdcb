"""Long-running workflows (issue 29): reserved for published values; no change yet.

Revision ID: 0012
"""

from __future__ import annotations

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
