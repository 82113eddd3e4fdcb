"""Version pinning (issue 37): ``@workflow(versioning="pinned")`` instances run only on
workers of the code version they started on.

``kenning_instances.pinned_version`` holds that version (a worker's ``code_version``, as
``kenning workers list`` shows it); NULL for an instance that may run on any worker (an
``auto_upgrade`` one, or a pinned one no worker claimed yet: its first claim pins it).
A nullable column without a default: a change of the catalog only, no rewrite, no scan.
No index: the claim reads the column on the rows its index already singles out.

Revision ID: 0024
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE kenning_instances ADD COLUMN pinned_version text")


def downgrade() -> None:
    op.execute("ALTER TABLE kenning_instances DROP COLUMN pinned_version")
