"""The names processes and statements agree on, each written once: NOTIFY channels and
history kinds (``kenning_history.kind``). Statements spell them through these constants
(``notify(CHANNEL_INSTANCES)``, ``f"... = '{COMPENSATION_FAILED}'"``), listeners and the
replay engine import them from here."""

from __future__ import annotations

# NOTIFY channels: payloads are empty, never data (NOTIFY caps payloads at 8,000 bytes);
# identical notifications of one transaction reach a listener once.
CHANNEL_INSTANCES = "kenning_instances"  # an instance became claimable: workers
CHANNEL_INBOX = "kenning_inbox"  # an event or a cancel arrived: the inbox processor
CHANNEL_TIMERS = "kenning_timers"  # a timer or an event timeout was registered: the scheduler
CHANNEL_OUTBOX = "kenning_outbox"  # an outbox message is due: the relayer
CHANNEL_SUBSCRIPTIONS = "kenning_subscriptions"  # a wait_event subscription was registered: the inbox processor


def notify(channel: str) -> str:
    """The SQL expression that notifies ``channel``: ``pg_notify`` returns void, so
    ``IS NULL`` makes it a boolean column (``... AS notified``)."""
    return f"pg_notify('{channel}', '') IS NULL"


# History kinds, as stored in kenning_history.kind.
ACTIVITY_COMPLETED = "ActivityCompleted"
ACTIVITY_FAILED = "ActivityFailed"
EVENT_RECEIVED = "EventReceived"
EVENT_TIMEOUT = "EventTimeout"
TIMER_EXPIRED = "TimerExpired"
COMPENSATION_EXECUTED = "CompensationExecuted"
COMPENSATION_FAILED = "CompensationFailed"
PATCH_MARKER = "PatchMarker"  # ctx.patched took the new path here (never replayed as a step)
HISTORY_KINDS = frozenset(
    {
        ACTIVITY_COMPLETED,
        ACTIVITY_FAILED,
        EVENT_RECEIVED,
        EVENT_TIMEOUT,
        TIMER_EXPIRED,
        COMPENSATION_EXECUTED,
        COMPENSATION_FAILED,
        PATCH_MARKER,
    }
)
