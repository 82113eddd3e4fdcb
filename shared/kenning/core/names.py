"""The names processes, statements and the engine agree on, each written once: NOTIFY
channels, history kinds (``kenning_history.kind``), the inbox event a child's end becomes,
and the ``KENNING_*`` variable of a flag. Plain values: the SQL that uses them is in
``kenning.storage`` (``storage/names.py`` builds the NOTIFY expressions)."""

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
# (a publish_value notifies it too, with its instance's id: Client.get_value(timeout=) reads again)


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


# History kinds, as stored in kenning_history.kind.
ACTIVITY_COMPLETED = "ActivityCompleted"


ACTIVITY_FAILED = "ActivityFailed"


EVENT_RECEIVED = "EventReceived"


EVENT_TIMEOUT = "EventTimeout"


TIMER_EXPIRED = "TimerExpired"


COMPENSATION_EXECUTED = "CompensationExecuted"


COMPENSATION_FAILED = "CompensationFailed"


# an operator skipped a compensation (``kenning instances skip-compensation``): done, never run
COMPENSATION_SKIPPED = "CompensationSkipped"


MESSAGE_SENT = "MessageSent"  # send_message: the message went into its recipient's mailbox


MESSAGE_RECEIVED = "MessageReceived"  # receive: the message it took from the mailbox


MESSAGE_TIMEOUT = "MessageTimeout"  # receive: nothing came within its timeout


MESSAGE_REPLIED = "MessageReplied"  # message.reply: the reply to a request, stored with this record


CHANNEL_SUBSCRIBED = "ChannelSubscribed"  # subscribe: a publish on the channel reaches this instance


PATCH_MARKER = "PatchMarker"  # ctx.patched took the new path here (never replayed as a step)


CHILD_STARTED = "ChildStarted"  # start_child: the child's id, committed with the child's row


VALUE_PUBLISHED = "ValuePublished"  # publish_value, set_status: the value was written with this record
STATUS_VALUE_KEY = "status"  # the published key set_status writes ({"text": ..., "progress": ...})


STREAM_WRITTEN = "StreamWritten"  # write_stream from workflow code: the entry (its offset) was written with this record
STREAM_CLOSED = "StreamClosed"  # close_stream from workflow code: the stream was closed with this record


HISTORY_KINDS = frozenset(
    {
        ACTIVITY_COMPLETED,
        ACTIVITY_FAILED,
        EVENT_RECEIVED,
        EVENT_TIMEOUT,
        TIMER_EXPIRED,
        COMPENSATION_EXECUTED,
        COMPENSATION_FAILED,
        COMPENSATION_SKIPPED,
        MESSAGE_SENT,
        MESSAGE_RECEIVED,
        MESSAGE_TIMEOUT,
        MESSAGE_REPLIED,
        CHANNEL_SUBSCRIBED,
        PATCH_MARKER,
        CHILD_STARTED,
        VALUE_PUBLISHED,
        STREAM_WRITTEN,
        STREAM_CLOSED,
    }
)


# The inbox event a child's end becomes: addressed to its parent, unique per child
# (``(source, id)`` = (CHILD_EVENT_SOURCE, child id)), so a retried child tells once.
CHILD_EVENT_TYPE = "kenning.child.finished"
CHILD_EVENT_SOURCE = "kenning.children"
# what a parent's end does to a child still unfinished (start_child's on_parent_cancel)
ON_PARENT_CANCEL = ("cancel", "abandon")


def env_name(flag: str, process: str = "") -> str:
    """``--batch-size`` -> ``KENNING_BATCH_SIZE``; with ``process="relayer"``,
    ``KENNING_RELAYER_BATCH_SIZE``."""
    name = f"{process}-{flag.lstrip('-')}" if process else flag.lstrip("-")
    return "KENNING_" + name.replace("-", "_").upper()


# The comp_id prefix of compensations ``@on_failure`` registers (kenning/compensation.py);
# a fork keeps those a kept activity registered (kenning/storage/forks.py).
ON_FAILURE_PREFIX = "on_failure:"
