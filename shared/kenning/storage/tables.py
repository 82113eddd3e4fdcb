"""The schema as SQLAlchemy Core tables, restating what the Alembic migrations create (the
DDL is in ``kenning/migrations/versions/``): a reader's map of the tables, and what
``tests/integration/test_schema.py`` checks the migrated database against. Statements are written in
SQL in the storage modules, not built from these tables.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, JSONB, UUID

metadata = MetaData()


def _ts(name: str, nullable: bool = True) -> Column[object]:
    return Column(name, DateTime(timezone=True), nullable=nullable)


workflow_definitions = Table(
    "kenning_workflow_definitions",
    metadata,
    Column("workflow_name", Text, primary_key=True),
    Column("source_hash", Text, primary_key=True),
    Column("source", Text, nullable=False),
    _ts("created_at", False),
    Column("retention_seconds", DOUBLE_PRECISION),  # migration 0004: @workflow(retention=...), NULL: the default
)

instances = Table(
    "kenning_instances",
    metadata,
    Column("id", Text, primary_key=True),
    Column("workflow_name", Text, nullable=False),
    Column("source_hash", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("input", JSONB, nullable=False),
    Column("result", JSONB),
    Column("error", JSONB),
    Column("idempotency_key", Text),
    Column("cancel_requested", Boolean, nullable=False),
    Column("lease_owner", Text),
    Column("lease_token", UUID(as_uuid=False)),
    _ts("available_at"),
    Column("attempts", JSONB, nullable=False),
    Column("run_count", Integer, nullable=False),
    Column("runs_without_progress", Integer, nullable=False),
    _ts("claimed_at"),
    _ts("created_at", False),
    _ts("updated_at", False),
    _ts("started_at"),
    _ts("finished_at"),
    # migration 0004: the scheduler's stuck check (kenning/storage/progress.py)
    Column("stuck_reason", Text),
    _ts("stuck_at"),
    Column("stuck_repairs", Integer, nullable=False),
    Column("trace_context", JSONB),  # migration 0004: kenning/observability/tracing.py's carrier
    # migration 0005: the queue it was started in (kenning/queues.py), NULL: none
    Column("queue_name", Text),
    Column("partition_key", Text),
    Column("priority", Integer, nullable=False),
    # migration 0005: a child workflow's parent (kenning/children.py), NULL at top level
    Column("parent_id", Text),
    Column("parent_step", Text),
    Column("on_parent_cancel", Text),
    _ts("deadline_at"),  # migration 0010: when its workflow timeout runs out (storage/deadlines.py)
    Column("run", Integer, nullable=False),  # migration 0011: continue_as_new's run in progress (storage/runs.py)
    Column("forked_from", Text),  # migration 0023: the instance it was forked from (storage/forks.py)
    Column("forked_from_step", Integer),  # migration 0023: the original's step it was forked at
    # migration 0024: the code version a pinned instance runs on (storage/claims.py), NULL: any
    Column("pinned_version", Text),
)

instance_runs = Table(
    "kenning_instance_runs",  # migration 0011: the earlier runs of a continue_as_new chain (storage/runs.py)
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("run", Integer, primary_key=True),
    Column("input", JSONB, nullable=False),
    _ts("started_at"),
    _ts("ended_at", False),
    Column("steps", Integer, nullable=False),
    Column("ended", Text, nullable=False),
)

queues = Table(
    "kenning_queues",  # migration 0005: a queue's limits and its claim's state (storage/queues.py)
    metadata,
    Column("name", Text, primary_key=True),
    Column("concurrency", Integer),
    Column("worker_concurrency", Integer),
    Column("rate_limit", Integer),
    Column("rate_period_seconds", DOUBLE_PRECISION),
    Column("partition_concurrency", Integer),
    Column("partition_strategy", Text, nullable=False),  # migration 0022, with key_rate_*
    Column("key_rate_limit", Integer),
    Column("key_rate_period_seconds", DOUBLE_PRECISION),
    Column("paused", Boolean, nullable=False),
    Column("claim_seq", BigInteger, nullable=False),
    Column("partition_cursor", Text, nullable=False),
    Column("workflow_names", ARRAY(Text), nullable=False),
    _ts("declared_at"),
    _ts("created_at", False),
)

history = Table(
    "kenning_history",
    metadata,
    Column("seq", BigInteger, nullable=False),
    Column("instance_id", Text, primary_key=True),
    Column("step_id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("step_name", Text, nullable=False),
    Column("payload", JSONB),
    Column("payload_bytes", LargeBinary),
    _ts("created_at", False),
    Column("attempts", Integer),  # 0007: the step's runs, the last included (NULL: not a run)
    _ts("started_at"),  # 0007: the last attempt's start, on the worker's clock
    Column("run_seconds", DOUBLE_PRECISION),  # 0007: the last attempt's run time
)

compensations = Table(
    "kenning_compensations",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("comp_id", Text, primary_key=True),
    Column("position", Integer, nullable=False),
    Column("function_name", Text, nullable=False),
    Column("args", JSONB, nullable=False),
    Column("kwargs", JSONB, nullable=False),
    Column("retry_policy", JSONB),
    _ts("created_at", False),
)

event_subscriptions = Table(
    "kenning_event_subscriptions",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("step_id", Text, primary_key=True),
    Column("step_name", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("match", JSONB),
    _ts("since"),
    _ts("timeout_at"),
    _ts("checked_at"),
    _ts("created_at", False),
)

timers = Table(
    "kenning_timers",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("step_id", Text, primary_key=True),
    Column("step_name", Text, nullable=False),
    _ts("due_at", False),
    _ts("created_at", False),
)

# migration 0005: an instance's mailboxes and a receive() waiting for one (kenning/storage/messages.py)
messages = Table(
    "kenning_messages",
    metadata,
    Column("seq", BigInteger, primary_key=True),
    Column("instance_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("data", JSONB),
    Column("sender_instance_id", Text),
    _ts("sent_at", False),
    Column("consumed_step_id", Text),
    _ts("consumed_at"),
)

channel_subscriptions = Table(
    "kenning_channel_subscriptions",
    metadata,
    Column("channel", Text, primary_key=True),
    Column("instance_id", Text, primary_key=True),
    _ts("created_at", False),
)

message_waits = Table(
    "kenning_message_waits",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("step_id", Text, primary_key=True),
    Column("step_name", Text, nullable=False),
    Column("topic", Text, nullable=False),
    _ts("timeout_at"),
    _ts("created_at", False),
)

# migration 0013: the reply to a request (Client.request; kenning/storage/replies.py)
replies = Table(
    "kenning_replies",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("message_id", Text, primary_key=True),
    Column("value", JSONB),
    Column("error", Text),
    _ts("replied_at", False),
)

inbox = Table(
    "kenning_inbox",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("instance_id", Text),
    Column("attributes", JSONB, nullable=False),
    Column("data", JSONB),
    Column("data_bytes", LargeBinary),
    Column("status", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    _ts("available_at", False),
    Column("claim_token", UUID(as_uuid=False)),
    Column("last_error", Text),
    _ts("received_at", False),
    _ts("processed_at"),
    Column("no_receiver", Boolean, nullable=False),  # migration 0008: processed with nothing to receive it
)

# migration 0008: the receivers each event type has in any version of the app a worker runs
event_receivers = Table(
    "kenning_event_receivers",
    metadata,
    Column("event_type", Text, primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    _ts("first_seen", False),
    _ts("last_seen", False),
)

outbox = Table(
    "kenning_outbox",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("instance_id", Text),
    Column("event_type", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("subject", Text),
    Column("content_type", Text),
    Column("data", JSONB),
    Column("data_bytes", LargeBinary),
    Column("extensions", JSONB, nullable=False),
    Column("status", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    _ts("available_at", False),
    Column("lease_owner", Text),
    Column("lease_token", UUID(as_uuid=False)),
    Column("last_error", Text),
    _ts("last_attempt_at"),
    Column("created_seq", BigInteger, nullable=False),
    _ts("created_at", False),
    _ts("published_at"),
)


# migration 0009: the fleet's processes, the operators' actions, the cron schedules
processes = Table(
    "kenning_processes",
    metadata,
    Column("id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", Text, nullable=False),
    _ts("started_at", False),
    _ts("last_seen", False),
    Column("expires_after_seconds", DOUBLE_PRECISION, nullable=False),
    Column("details", JSONB, nullable=False),
)

operator_actions = Table(
    "kenning_operator_actions",
    metadata,
    Column("id", BigInteger, primary_key=True),
    _ts("at", False),
    Column("action", Text, nullable=False),
    Column("origin", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("target", Text),
    Column("filter", JSONB),
    Column("affected", Integer, nullable=False),
    Column("reason", Text),
    Column("details", JSONB, nullable=False),
)

schedules = Table(
    "kenning_schedules",
    metadata,
    Column("workflow_name", Text, primary_key=True),
    Column("expression", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("paused_reason", Text),
    Column("overlap", Text, nullable=False),
    _ts("last_tick"),
    _ts("next_tick"),
    Column("last_instance_id", Text),  # the instance the schedule last started (overlap)
    _ts("updated_at", False),
    _ts("decided_at"),  # migration 0014: when a scheduler last decided a tick (catch-up)
)

# migration 0012: published values (publish_value, set_status) and search attributes
values = Table(
    "kenning_values",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", JSONB),
    _ts("updated_at", False),
)

search_attributes = Table(
    "kenning_search_attributes",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
    _ts("created_at", False),  # the instance's, copied: the lookup index orders by it
)

# migration 0019: durable streams (write_stream, close_stream, Client.read_stream)
streams = Table(
    "kenning_streams",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("length", BigInteger, nullable=False),  # the next entry's offset
    Column("writers", JSONB, nullable=False),  # per activity step: [last writer, its attempt number]
    _ts("created_at", False),
    _ts("updated_at", False),
    _ts("closed_at"),
    Column("ended", Boolean, nullable=False),  # closed by its instance's end (a retry reopens it)
)

stream_entries = Table(
    "kenning_stream_entries",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("offset", BigInteger, primary_key=True),
    Column("attempt", Integer, nullable=False),  # 0: written by workflow code
    Column("step_id", Text),
    Column("value", JSONB),
    _ts("written_at", False),
)

# migration 0021: the debounced bursts and event batches (kenning/storage/flow.py)
bursts = Table(
    "kenning_bursts",
    metadata,
    Column("instance_id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("workflow_name", Text, nullable=False),
    Column("flow_key", Text, nullable=False),
    _ts("opened_at", False),
    _ts("last_at", False),
    Column("folded", Integer, nullable=False),
    Column("period_seconds", DOUBLE_PRECISION),
    Column("max_wait_seconds", DOUBLE_PRECISION),
    Column("max_size", Integer),
    Column("seqs", ARRAY(BigInteger)),
)
