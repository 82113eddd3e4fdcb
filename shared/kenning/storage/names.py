"""The names processes and statements agree on, each written once: NOTIFY channels and
history kinds (``kenning_history.kind``). Statements spell them through these constants
(``notify(CHANNEL_INSTANCES)``, ``f"... = '{COMPENSATION_FAILED}'"``), listeners and the
replay engine import them from here."""

from __future__ import annotations

# NOTIFY channels: payloads are empty, never data (NOTIFY caps payloads at 8,000 bytes),
# but for CHANNEL_RESULTS's instance ids; identical notifications of one transaction reach
# a listener once.
CHANNEL_INSTANCES = "kenning_instances"  # an instance became claimable: workers
CHANNEL_INBOX = "kenning_inbox"  # an event or a cancel arrived: the inbox processor
CHANNEL_TIMERS = "kenning_timers"  # a timer or an event timeout was registered: the scheduler
CHANNEL_OUTBOX = "kenning_outbox"  # an outbox message is due: the relayer
CHANNEL_SUBSCRIPTIONS = "kenning_subscriptions"  # a wait_event subscription was registered: the inbox processor
CHANNEL_RESULTS = "kenning_results"  # instances finished (payload: their ids): clients awaiting results
# a start created a queue or named a new workflow in one: workers read their queues again
# (they claim only from the queues they know: kenning_worker/queues.py)
CHANNEL_QUEUES = "kenning_queues"

# The advisory locks (bigint keys from "KENNING" in ASCII on, unlikely to meet an
# application's own) that each connection listening on CHANNEL_RESULTS holds shared for
# its session. A statement finishing instances first tries to take one of them (its
# backend's) exclusively for its transaction: if it can, no client listens, and it sends
# no NOTIFY (a NOTIFY costs every listening backend a transaction, and notifying commits
# take turns). A client that starts to listen meanwhile waits for that transaction's
# end, so its first read sees what it finished. Two finishing statements on the same
# lock at once make the second notify needlessly; spread over several locks, they
# seldom meet.
RESULTS_LISTENERS_LOCK = 0x4B454E4E494E47
RESULTS_LISTENERS_LOCKS = 16


def notify(channel: str) -> str:
    """The SQL expression that notifies ``channel``: ``pg_notify`` returns void, so
    ``IS NULL`` makes it a boolean column (``... AS notified``)."""
    return f"pg_notify('{channel}', '') IS NULL"


# A finished instance's id goes into CHANNEL_RESULTS's payload (a JSON array) if its JSON
# form is at most this long; a longer one is sent as null, which wakes every waiter of
# the client (it reads its own instance's row). Payloads are filled up to
# _RESULTS_PAYLOAD_FILL bytes, so with one more id at most they stay under NOTIFY's 8,000.
_RESULTS_ID_BYTES = 1000
_RESULTS_PAYLOAD_FILL = 6800


def _results_payload_id(id_column: str) -> str:
    return f"CASE WHEN octet_length(CAST(to_json({id_column}) AS text)) <= {_RESULTS_ID_BYTES} THEN {id_column} END"


def notify_results(finished: str) -> str:
    """A scalar subquery notifying CHANNEL_RESULTS of the instances in ``finished`` (a CTE
    of the statement with an ``id`` column: the instances it ended), if any client
    listens (RESULTS_LISTENERS_LOCK): one notification per statement, more only when the
    ids need more than one payload. True if any was sent, NULL if none was. The
    statement's main query must read this column: a CTE that only selects runs only if
    it is read."""
    lock = f"{RESULTS_LISTENERS_LOCK} + pg_backend_pid() % {RESULTS_LISTENERS_LOCKS}"
    return f"""(CASE WHEN pg_try_advisory_xact_lock({lock}) THEN NULL ELSE (
        SELECT bool_and(n.sent) FROM (
            SELECT pg_notify('{CHANNEL_RESULTS}', CAST(json_agg(c.id ORDER BY c.id) AS text)) IS NOT NULL AS sent
            FROM (SELECT {_results_payload_id("f.id")} AS id,
                         sum(least(octet_length(CAST(to_json(f.id) AS text)), {_RESULTS_ID_BYTES}) + 2)
                             OVER (ORDER BY f.id) / {_RESULTS_PAYLOAD_FILL} AS chunk
                  FROM {finished} AS f) AS c
            GROUP BY c.chunk) AS n) END)"""


def notify_result(id_column: str) -> str:
    """The SQL expression notifying CHANNEL_RESULTS that the one instance ``id_column``
    finished (a boolean, true), for a statement that ends instances one row at a time
    and rarely (the claim parking a crash loop). (A void is not NULL: ``IS NOT NULL``
    makes the call a true.)"""
    return (
        f"pg_notify('{CHANNEL_RESULTS}', CAST(json_build_array({_results_payload_id(id_column)}) AS text)) IS NOT NULL"
    )


# History kinds, as stored in kenning_history.kind.
ACTIVITY_COMPLETED = "ActivityCompleted"
ACTIVITY_FAILED = "ActivityFailed"
EVENT_RECEIVED = "EventReceived"
EVENT_TIMEOUT = "EventTimeout"
TIMER_EXPIRED = "TimerExpired"
COMPENSATION_EXECUTED = "CompensationExecuted"
COMPENSATION_FAILED = "CompensationFailed"
MESSAGE_SENT = "MessageSent"  # send_message: the message went into its recipient's mailbox
MESSAGE_RECEIVED = "MessageReceived"  # receive: the message it took from the mailbox
MESSAGE_TIMEOUT = "MessageTimeout"  # receive: nothing came within its timeout
CHANNEL_SUBSCRIBED = "ChannelSubscribed"  # subscribe: a publish on the channel reaches this instance
PATCH_MARKER = "PatchMarker"  # ctx.patched took the new path here (never replayed as a step)
CHILD_STARTED = "ChildStarted"  # start_child: the child's id, committed with the child's row
HISTORY_KINDS = frozenset(
    {
        ACTIVITY_COMPLETED,
        ACTIVITY_FAILED,
        EVENT_RECEIVED,
        EVENT_TIMEOUT,
        TIMER_EXPIRED,
        COMPENSATION_EXECUTED,
        COMPENSATION_FAILED,
        MESSAGE_SENT,
        MESSAGE_RECEIVED,
        MESSAGE_TIMEOUT,
        CHANNEL_SUBSCRIBED,
        PATCH_MARKER,
        CHILD_STARTED,
    }
)
