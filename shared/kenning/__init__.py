"""Kenning: durable workflows for Python on PostgreSQL.

Edda 0.1.0's user API under one import name; see the README for the processes.
"""

# First, before anything slow: in the `kenning` command's process its import takes SIGTERM
# over, so a stop while the command imports exits 0 (kenning/core/stopping.py).
from kenning.core import stopping as _stopping  # noqa: F401

# isort: split
from kenning.activity import Activity, activity
from kenning.app import App, EddaApp
from kenning.children import ChildHandle, start_child
from kenning.client import Client, StartedInstance
from kenning.compensation import compensation, on_failure, register_compensation
from kenning.context import WorkflowContext
from kenning.errors import (
    ActivityTimeoutError,
    ChildStartRefused,
    ChildWorkflowFailed,
    ConfigurationError,
    DatabaseUnavailableError,
    EventTimeoutError,
    HeartbeatTimeoutError,
    KenningError,
    LeaseLostError,
    MessageAlreadyRepliedError,
    MessageUndeliverableError,
    NonDeterminismError,
    RequestError,
    RequestNotAnsweredError,
    RequestRejectedError,
    RequestTimeoutError,
    RetryExhaustedError,
    StreamClosedError,
    StreamFullError,
    TerminalError,
    UnstorableValueError,
    ValueNotPublishedError,
    WorkflowCancelledException,
    WorkflowFailedError,
    WorkflowNotFoundError,
    WorkflowTimeoutError,
)
from kenning.events import ReceivedEvent, wait_event
from kenning.flow import Batch, Debounce, RateLimit
from kenning.hooks import HooksBase, WorkflowHooks
from kenning.messages import (
    PublishedStatus,
    ReceivedMessage,
    publish,
    publish_value,
    receive,
    send_message,
    set_status,
    subscribe,
)
from kenning.observability.logs import library_defaults as _library_defaults
from kenning.outbox import send_event_transactional
from kenning.queues import Queue
from kenning.retry import RetryPolicy
from kenning.streams import StreamEntry, close_stream, write_stream
from kenning.timers import sleep, sleep_until, wait_timer, wait_until
from kenning.workflow import Workflow, continue_as_new, workflow

# a library in someone's program prints nothing to stdout (structlog's defaults would)
_library_defaults()

__all__ = [
    "Activity",
    "ActivityTimeoutError",
    "App",
    "Batch",
    "ChildHandle",
    "ChildStartRefused",
    "ChildWorkflowFailed",
    "Client",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "Debounce",
    "EddaApp",
    "EventTimeoutError",
    "HeartbeatTimeoutError",
    "HooksBase",
    "KenningError",
    "LeaseLostError",
    "MessageAlreadyRepliedError",
    "MessageUndeliverableError",
    "NonDeterminismError",
    "PublishedStatus",
    "Queue",
    "RateLimit",
    "ReceivedEvent",
    "ReceivedMessage",
    "RequestError",
    "RequestNotAnsweredError",
    "RequestRejectedError",
    "RequestTimeoutError",
    "RetryExhaustedError",
    "RetryPolicy",
    "StartedInstance",
    "StreamClosedError",
    "StreamEntry",
    "StreamFullError",
    "TerminalError",
    "UnstorableValueError",
    "ValueNotPublishedError",
    "Workflow",
    "WorkflowCancelledException",
    "WorkflowContext",
    "WorkflowFailedError",
    "WorkflowHooks",
    "WorkflowNotFoundError",
    "WorkflowTimeoutError",
    "activity",
    "close_stream",
    "compensation",
    "continue_as_new",
    "on_failure",
    "publish",
    "publish_value",
    "receive",
    "register_compensation",
    "send_event_transactional",
    "send_message",
    "set_status",
    "sleep",
    "sleep_until",
    "start_child",
    "subscribe",
    "wait_event",
    "wait_timer",
    "wait_until",
    "workflow",
    "write_stream",
]
