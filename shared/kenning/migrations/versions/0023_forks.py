"""Forks (issue 37): ``kenning instances fork ID --from-step STEP``.

A fork is a new instance whose history is a copy of its original's up to a step; the two
link to each other through ``kenning_instances.forked_from`` (the original's id, NULL for
an instance that is not a fork) and ``forked_from_step`` (the step it was forked at, as
``kenning instances show`` numbers the original's history). The original finds its forks
through the partial index ``kenning_instances_forked_from`` (``kenning/storage/forks.py``).

Cost on a big table: two nullable columns without a default are catalog changes (no
rewrite, a brief ACCESS EXCLUSIVE lock); the partial index holds forks only, so building it
reads the table once and writes almost nothing.

Revision ID: 0023
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0028"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE kenning_instances ADD COLUMN IF NOT EXISTS forked_from text;
ALTER TABLE kenning_instances ADD COLUMN IF NOT EXISTS forked_from_step integer;
CREATE INDEX IF NOT EXISTS kenning_instances_forked_from ON kenning_instances (forked_from)
    WHERE forked_from IS NOT NULL;
"""

DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_forked_from;
ALTER TABLE kenning_instances DROP COLUMN IF EXISTS forked_from_step;
ALTER TABLE kenning_instances DROP COLUMN IF EXISTS forked_from;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
