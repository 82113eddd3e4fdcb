"""Edda 0.16's names and module layout over Kenning, where Kenning has the same meaning: a
program written for Edda runs after its ``edda`` imports become ``kenning.compat.edda``
(``from edda.workflow import recur`` -> ``from kenning.compat.edda.workflow import recur``).

What differs is named in docs/migrating-from-edda.md: ``recur`` is ``continue_as_new``;
channels are Kenning's messages (``channels.py``); ``EddaApp`` is Kenning's ``App`` with
``storage`` and ``handle_cloudevent`` (``app.py``). Edda's names with no same meaning here
(competing consumers, ``send_event`` outside the outbox, the WSGI app, the in-process
relayer) are left out, so that a program using them fails at its import, not later.
"""

from kenning.compat.edda.activity import activity
from kenning.compat.edda.app import EddaApp
from kenning.compat.edda.channels import ChannelMessage, publish, receive, send_to, subscribe
from kenning.compat.edda.compensation import compensation, on_failure, register_compensation
from kenning.compat.edda.context import WorkflowContext
from kenning.compat.edda.outbox import send_event_transactional
from kenning.compat.edda.workflow import recur, workflow
from kenning.errors import EventTimeoutError, RetryExhaustedError, TerminalError
from kenning.events import ReceivedEvent, wait_event
from kenning.hooks import HooksBase, WorkflowHooks
from kenning.retry import RetryPolicy
from kenning.timers import sleep, sleep_until, wait_timer, wait_until

__all__ = [
    "ChannelMessage",
    "EddaApp",
    "EventTimeoutError",
    "HooksBase",
    "ReceivedEvent",
    "RetryExhaustedError",
    "RetryPolicy",
    "TerminalError",
    "WorkflowContext",
    "WorkflowHooks",
    "activity",
    "compensation",
    "on_failure",
    "publish",
    "receive",
    "recur",
    "register_compensation",
    "send_event_transactional",
    "send_to",
    "sleep",
    "sleep_until",
    "subscribe",
    "wait_event",
    "wait_timer",
    "wait_until",
    "workflow",
]
