"""Long-running workflows (issue 29): published values and search attributes.

``kenning_values``: the latest value a running workflow published per (instance, key)
(``publish_value``, ``set_status`` under the reserved key ``status``), read by clients
without a worker; written with the publishing step's record, kept after the instance
ends and deleted with it by retention. ``kenning_search_attributes``: the declared keys'
values (``@workflow(search_attributes=...)``) as text, with the instance's ``created_at``
copied in, so ``kenning_search_attributes_lookup`` on (key, value, created_at DESC,
instance_id DESC) serves a ``--where key=value`` list page newest first (the console's
order, ties by id descending) by reading only the page's index entries, however many
instances match.

Two new, empty tables and their indexes: catalog changes, no scan nor lock of an existing
table; the cost is on the write path (a publish writes one or two rows beside its step
record). Measured at 1 million instances: docs/performance.md.

Revision ID: 0012
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_values (
    instance_id text NOT NULL,
    key         text NOT NULL,
    value       jsonb,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, key)
);
CREATE TABLE IF NOT EXISTS kenning_search_attributes (
    instance_id text NOT NULL,
    key         text NOT NULL,
    value       text NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (instance_id, key)
);
CREATE INDEX IF NOT EXISTS kenning_search_attributes_lookup
    ON kenning_search_attributes (key, value, created_at DESC, instance_id DESC);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_search_attributes;
DROP TABLE IF EXISTS kenning_values;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
