"""Kenning: durable workflows for Python on PostgreSQL.

Edda 0.1.0's user API under one import name; see the README for the processes.
"""

from kenning.activity import Activity, activity
from kenning.app import App, EddaApp
from kenning.client import Client, StartedInstance
from kenning.compensation import compensation, on_failure, register_compensation
from kenning.context import WorkflowContext
from kenning.errors import (
    ActivityTimeoutError,
    ConfigurationError,
    EventTimeoutError,
    KenningError,
    LeaseLostError,
    NonDeterminismError,
    RetryExhaustedError,
    TerminalError,
    UnstorableValueError,
    WorkflowCancelledException,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from kenning.events import ReceivedEvent, wait_event
from kenning.hooks import HooksBase, WorkflowHooks
from kenning.outbox import send_event_transactional
from kenning.retry import RetryPolicy
from kenning.timers import wait_timer, wait_until
from kenning.workflow import Workflow, workflow

__all__ = [
    "Activity",
    "ActivityTimeoutError",
    "App",
    "Client",
    "ConfigurationError",
    "EddaApp",
    "EventTimeoutError",
    "HooksBase",
    "KenningError",
    "LeaseLostError",
    "NonDeterminismError",
    "ReceivedEvent",
    "RetryExhaustedError",
    "RetryPolicy",
    "StartedInstance",
    "TerminalError",
    "UnstorableValueError",
    "Workflow",
    "WorkflowCancelledException",
    "WorkflowContext",
    "WorkflowFailedError",
    "WorkflowHooks",
    "WorkflowNotFoundError",
    "activity",
    "compensation",
    "on_failure",
    "register_compensation",
    "send_event_transactional",
    "wait_event",
    "wait_timer",
    "wait_until",
    "workflow",
]
