"""Long-running workflows (issue 29): reserved for requests; no change yet.

Revision ID: 0013
"""

from __future__ import annotations

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
