"""Composition and flow control (issue 19): child workflows, messages between workflows,
queues with limits. Each part's DDL is its own statement block below, so the parts can land
apart; an empty block is a part that has not landed.

Locks (docs/operations.md, "Upgrading across migration 0005"): the whole upgrade is one
transaction, and its ALTER TABLEs of kenning_instances take an ACCESS EXCLUSIVE lock held
until it commits; the claimable index rebuild (DROP INDEX, plain CREATE INDEX) and the
status CHECK (validated against every row) each read the whole table under it, so no claim,
step, start or read of an instance proceeds meanwhile. The downgrade drops the children's
parent_id: a parent waiting for a child's end then waits forever (the older code neither
tells nor repairs it); let such parents finish, or cancel them, first.

Revision ID: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# ------------------------------------------------------------------ child workflows
# A child instance names its parent, the parent's step that started it (start_child) and
# what the parent's end does to it while it is unfinished: 'cancel' (a cancellation is
# requested) or 'abandon' (left to run). NULL parent_id: a top-level instance.
CHILDREN_UPGRADE = """
ALTER TABLE kenning_instances
    ADD COLUMN parent_id text,
    ADD COLUMN parent_step text,
    ADD COLUMN on_parent_cancel text CHECK (on_parent_cancel IN ('cancel', 'abandon'));
-- a parent's children: its end (cancel them), instances show, retention (keep them for it)
CREATE INDEX kenning_instances_parent ON kenning_instances (parent_id) WHERE parent_id IS NOT NULL;
"""

CHILDREN_DOWNGRADE = """
DROP INDEX IF EXISTS kenning_instances_parent;
ALTER TABLE kenning_instances
    DROP COLUMN IF EXISTS on_parent_cancel,
    DROP COLUMN IF EXISTS parent_step,
    DROP COLUMN IF EXISTS parent_id;
"""

# ------------------------------------------------------------------ messages
# A mailbox is an instance's messages of one topic (kenning/storage/messages.py): seq orders
# it (senders and the receiver of one mailbox take turns on an advisory lock, so seq order
# is commit order), message_id makes a send idempotent per recipient, and consumed_step_id
# names the receive step that took the message (NULL: still in the mailbox). A receiver
# waiting for its mailbox has a kenning_message_waits row, as a wait_event has a
# subscription; its timeout_at is fired by the scheduler. The waiting-for-message index
# lets the stuck check find such instances without reading every finished row.
MESSAGES_UPGRADE = """
CREATE TABLE IF NOT EXISTS kenning_messages (
    seq                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id        text NOT NULL,
    topic              text NOT NULL,
    message_id         text NOT NULL,
    data               jsonb,
    sender_instance_id text,
    sent_at            timestamptz NOT NULL DEFAULT now(),
    consumed_step_id   text,
    consumed_at        timestamptz,
    UNIQUE (instance_id, message_id)
);
CREATE INDEX IF NOT EXISTS kenning_messages_mailbox ON kenning_messages (instance_id, topic, seq)
    WHERE consumed_step_id IS NULL;
CREATE TABLE IF NOT EXISTS kenning_message_waits (
    instance_id text NOT NULL,
    step_id     text NOT NULL,
    step_name   text NOT NULL,
    topic       text NOT NULL,
    timeout_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, step_id)
);
CREATE INDEX IF NOT EXISTS kenning_message_waits_timeout ON kenning_message_waits (timeout_at)
    WHERE timeout_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS kenning_instances_waiting_message ON kenning_instances (id)
    WHERE status = 'waiting_for_message';
-- broadcast (publish): the instances subscribed to a channel; a publish puts a copy of its
-- message into each one's mailbox of that topic
CREATE TABLE IF NOT EXISTS kenning_channel_subscriptions (
    channel     text NOT NULL,
    instance_id text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, instance_id)
);
CREATE INDEX IF NOT EXISTS kenning_channel_subscriptions_instance ON kenning_channel_subscriptions (instance_id);
"""

MESSAGES_DOWNGRADE = """
UPDATE kenning_instances SET status = 'pending', available_at = now() WHERE status = 'waiting_for_message';
DROP INDEX IF EXISTS kenning_instances_waiting_message;
DROP TABLE IF EXISTS kenning_channel_subscriptions;
DROP TABLE IF EXISTS kenning_message_waits;
DROP TABLE IF EXISTS kenning_messages;
"""

# ------------------------------------------------------------------ queues
# An instance started in a queue (queue_name) is claimed only by the queued claim
# (kenning/storage/queues.py), which enforces the queue's limits; the claimable index
# leaves queued rows out, so the plain claim never scans a queue's backlog. A queued row's
# partition_key is '' when it names none (one partition). kenning_queues holds each
# queue's limits (synced by workers from the code's Queue declarations, or created bare
# by the first start into an undeclared queue), the operator's pause, and the claim's
# own state: claim_seq, bumped by every claim that admits instances (a claim whose
# snapshot predates the last bump admits nothing: its counts would be stale), and the
# partition key the last claim served (the round-robin's cursor); workflow_names: the
# workflows ever started into it (a worker claims only from queues holding its own).
QUEUES_UPGRADE = """
ALTER TABLE kenning_instances ADD COLUMN queue_name text;
ALTER TABLE kenning_instances ADD COLUMN partition_key text;
ALTER TABLE kenning_instances ADD COLUMN priority integer NOT NULL DEFAULT 0;

CREATE TABLE kenning_queues (
    name                  text PRIMARY KEY,
    concurrency           integer CHECK (concurrency > 0),
    worker_concurrency    integer CHECK (worker_concurrency > 0),
    rate_limit            integer CHECK (rate_limit > 0),
    rate_period_seconds   double precision CHECK (rate_period_seconds > 0),
    partition_concurrency integer CHECK (partition_concurrency > 0),
    paused                boolean NOT NULL DEFAULT false,
    claim_seq             bigint NOT NULL DEFAULT 0,
    partition_cursor      text NOT NULL DEFAULT '',
    workflow_names        text[] NOT NULL DEFAULT '{}',
    declared_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_seconds IS NULL))
);

DROP INDEX kenning_instances_claimable;
CREATE INDEX kenning_instances_claimable ON kenning_instances (available_at)
    WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NULL;
-- the queued claim's walk over a queue's partitions and its pick within one
CREATE INDEX kenning_instances_queued ON kenning_instances (queue_name, partition_key, priority, available_at)
    WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL;
-- the stuck check's queued runnable rows without a due time (none, unless something is
-- wrong): kenning_instances_queued cannot find them without reading the whole backlog
CREATE INDEX kenning_instances_queued_undue ON kenning_instances (id)
    WHERE status IN ('pending', 'running', 'compensating') AND queue_name IS NOT NULL AND available_at IS NULL;
-- what holds a queue's slots: its leased instances (a lease that expired holds none)
CREATE INDEX kenning_instances_queue_leased ON kenning_instances (queue_name, available_at)
    INCLUDE (partition_key, lease_owner)
    WHERE lease_token IS NOT NULL AND queue_name IS NOT NULL;
-- a rate limit's window: a queue's starts (first claims) by time
CREATE INDEX kenning_instances_queue_started ON kenning_instances (queue_name, started_at)
    WHERE queue_name IS NOT NULL AND started_at IS NOT NULL;
"""

QUEUES_DOWNGRADE = """
DROP INDEX kenning_instances_queue_started;
DROP INDEX kenning_instances_queue_leased;
DROP INDEX kenning_instances_queued_undue;
DROP INDEX kenning_instances_queued;
DROP INDEX kenning_instances_claimable;
CREATE INDEX kenning_instances_claimable ON kenning_instances (available_at)
    WHERE status IN ('pending', 'running', 'compensating');
DROP TABLE kenning_queues;
ALTER TABLE kenning_instances DROP COLUMN priority;
ALTER TABLE kenning_instances DROP COLUMN partition_key;
ALTER TABLE kenning_instances DROP COLUMN queue_name;
"""


# ------------------------------------------------------------------ instance statuses
# kenning_instances.status's CHECK, rebuilt once after the blocks from 0001's statuses and
# the ones each part adds here (one line per part: rebuilding it inside a block would drop
# the statuses another block added).
STATUSES_0001 = [
    "pending",
    "running",
    "waiting_for_event",
    "waiting_for_timer",
    "compensating",
    "completed",
    "failed",
    "cancelled",
]
ADDED_STATUSES = [
    "waiting_for_message",  # messages: a receive() waiting for its mailbox
]


def _status_check(statuses: list[str]) -> str:
    allowed = ", ".join(f"'{status}'" for status in statuses)
    return f"""
ALTER TABLE kenning_instances DROP CONSTRAINT IF EXISTS kenning_instances_status_check;
ALTER TABLE kenning_instances ADD CONSTRAINT kenning_instances_status_check CHECK (status IN ({allowed}));
"""


def upgrade() -> None:
    op.execute(CHILDREN_UPGRADE)
    op.execute(MESSAGES_UPGRADE)
    op.execute(QUEUES_UPGRADE)
    op.execute(_status_check(STATUSES_0001 + ADDED_STATUSES))


def downgrade() -> None:
    op.execute(QUEUES_DOWNGRADE)
    op.execute(MESSAGES_DOWNGRADE)
    op.execute(CHILDREN_DOWNGRADE)
    op.execute(_status_check(STATUSES_0001))
