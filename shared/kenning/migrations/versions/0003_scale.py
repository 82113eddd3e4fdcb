"""Storage tuned for large tables (issue 15): fillfactor, autovacuum and statistics of the
hot tables, partial indexes. Reserved: filled in by the change that measures them.

Revision ID: 0003
"""

from __future__ import annotations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
