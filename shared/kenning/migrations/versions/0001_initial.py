"""Initial schema: definitions, instances, history, compensations, subscriptions, timers,
inbox and outbox.

Revision ID: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

INSTANCE_STATUSES = (
    "'pending', 'running', 'waiting_for_event', 'waiting_for_timer', 'compensating', 'completed', 'failed', 'cancelled'"
)

UPGRADE = f"""
CREATE TABLE kenning_workflow_definitions (
    workflow_name text NOT NULL,
    source_hash   text NOT NULL,
    source        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, source_hash)
);

-- available_at is when a worker may next claim the instance: the run-after time while
-- it is pending (new, woken, or backing off), the lease expiry while a worker holds it.
-- One column keeps the claim a single ordered index range scan.
CREATE TABLE kenning_instances (
    id               text PRIMARY KEY,
    workflow_name    text NOT NULL,
    source_hash      text NOT NULL DEFAULT '',
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ({INSTANCE_STATUSES})),
    input            jsonb NOT NULL DEFAULT '{{}}',
    result           jsonb,
    error            jsonb,
    idempotency_key  text,
    cancel_requested boolean NOT NULL DEFAULT false,
    lease_owner      text,
    lease_token      uuid,
    available_at     timestamptz,
    attempts         jsonb NOT NULL DEFAULT '{{}}',
    run_count        integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);
CREATE INDEX kenning_instances_claimable ON kenning_instances (available_at)
    WHERE status IN ('pending', 'running', 'compensating');
CREATE UNIQUE INDEX kenning_instances_idempotency ON kenning_instances (workflow_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX kenning_instances_lease_token ON kenning_instances (lease_token)
    WHERE lease_token IS NOT NULL;
CREATE INDEX kenning_instances_created ON kenning_instances (created_at DESC);

-- One row per recorded step; (instance_id, step_id) is the exactly-once guarantee.
CREATE TABLE kenning_history (
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    instance_id text NOT NULL,
    step_id     text NOT NULL,
    kind        text NOT NULL,
    step_name   text NOT NULL,
    payload     jsonb,
    payload_bytes bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, step_id)
);

CREATE TABLE kenning_compensations (
    instance_id   text NOT NULL,
    comp_id       text NOT NULL,
    position      integer NOT NULL,
    function_name text NOT NULL,
    args          jsonb NOT NULL DEFAULT '[]',
    kwargs        jsonb NOT NULL DEFAULT '{{}}',
    retry_policy  jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, comp_id)
);

-- An instance waiting in wait_event. It takes events of event_type received at or after
-- coalesce(since, created_at) whose data contains match (all of them when match is NULL).
-- checked_at is set once a worker has looked in the inbox for an event received before the
-- subscription committed (the since window, and the race with an event being delivered).
CREATE TABLE kenning_event_subscriptions (
    instance_id  text NOT NULL,
    step_id      text NOT NULL,
    step_name    text NOT NULL,
    event_type   text NOT NULL,
    match        jsonb,
    since        timestamptz,
    timeout_at   timestamptz,
    checked_at   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, step_id)
);
CREATE INDEX kenning_event_subscriptions_type ON kenning_event_subscriptions (event_type);
CREATE INDEX kenning_event_subscriptions_timeout ON kenning_event_subscriptions (timeout_at)
    WHERE timeout_at IS NOT NULL;
CREATE INDEX kenning_event_subscriptions_unchecked ON kenning_event_subscriptions (created_at)
    WHERE checked_at IS NULL;

CREATE TABLE kenning_timers (
    instance_id text NOT NULL,
    step_id     text NOT NULL,
    step_name   text NOT NULL,
    due_at      timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, step_id)
);
CREATE INDEX kenning_timers_due ON kenning_timers (due_at);

-- Accepted CloudEvents (kind 'event') and cancellation requests (kind 'cancel'), written by
-- the ingress, processed by workers. instance_id is the instance addressed (the
-- kenninginstanceid extension, or the cancel target). attributes holds every context
-- attribute; data is JSON (or a text string), data_bytes binary data. available_at is when
-- a worker may next claim the row: now, a retry back-off, or the expiry of a claim, whose
-- claim_token fences the worker that holds it. Processed rows are kept for the retention
-- period: they answer duplicates and wait_event(since=...).
CREATE TABLE kenning_inbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          text NOT NULL DEFAULT 'event' CHECK (kind IN ('event', 'cancel')),
    source        text NOT NULL,
    event_id      text NOT NULL,
    event_type    text NOT NULL,
    instance_id   text,
    attributes    jsonb NOT NULL DEFAULT '{{}}',
    data          jsonb,
    data_bytes    bytea,
    status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'processed', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    available_at  timestamptz NOT NULL DEFAULT now(),
    claim_token   uuid,
    last_error    text,
    received_at   timestamptz NOT NULL DEFAULT now(),
    processed_at  timestamptz,
    UNIQUE (kind, source, event_id)
);
CREATE INDEX kenning_inbox_pending ON kenning_inbox (available_at, id) WHERE status = 'pending';
CREATE INDEX kenning_inbox_type_received ON kenning_inbox (event_type, received_at) WHERE kind = 'event';
CREATE INDEX kenning_inbox_processed ON kenning_inbox (processed_at) WHERE status = 'processed';

-- Outbox rows: events an activity sent, committed with its result. available_at is when a
-- relayer may next claim the row: the next attempt time while pending (new, or backing off),
-- the lease expiry while publishing. created_seq orders each instance's events.
CREATE TABLE kenning_outbox (
    id              uuid PRIMARY KEY,
    instance_id     text,
    event_type      text NOT NULL,
    source          text NOT NULL,
    subject         text,
    content_type    text,
    data            jsonb,
    data_bytes      bytea,
    extensions      jsonb NOT NULL DEFAULT '{{}}',
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'publishing', 'published', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_token     uuid,
    last_error      text,
    last_attempt_at timestamptz,
    created_seq     bigint GENERATED ALWAYS AS IDENTITY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz
);
CREATE INDEX kenning_outbox_due ON kenning_outbox (available_at, created_seq)
    WHERE status IN ('pending', 'publishing');
CREATE INDEX kenning_outbox_instance_order ON kenning_outbox (instance_id, created_seq)
    WHERE status IN ('pending', 'publishing');
CREATE INDEX kenning_outbox_published ON kenning_outbox (published_at) WHERE status = 'published';
CREATE INDEX kenning_outbox_failed ON kenning_outbox (created_seq) WHERE status = 'failed';
"""

DOWNGRADE = """
DROP TABLE IF EXISTS kenning_outbox, kenning_inbox, kenning_timers, kenning_event_subscriptions,
    kenning_compensations, kenning_history, kenning_instances, kenning_workflow_definitions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
