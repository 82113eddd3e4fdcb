"""Operations (issue 16): retention, the reason an instance has no way forward, trace
context. Reserved: filled in by the changes that use them.

Revision ID: 0004
"""

from __future__ import annotations

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
