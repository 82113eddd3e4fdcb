"""The public face is frozen (issue 26, item 2): what ``kenning`` exports and every import
path the README and the docs show a user. A move inside the package that breaks one of
these fails here first; an addition is a decision, made by adding it to this list."""

from __future__ import annotations

import importlib

import pytest

import kenning

EXPORTS = [
    "Activity",
    "ActivityTimeoutError",
    "App",
    "Batch",  # issue 35: flow control per key
    "ChildHandle",
    "ChildStartRefused",
    "ChildWorkflowFailed",
    "Client",
    "ConfigurationError",
    "DatabaseUnavailableError",  # issue 33, item 5: a client's call met an unavailable database
    "Debounce",  # issue 35: flow control per key
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

# module: the names a user imports from it (README, docs, examples, Edda's own paths)
DOCUMENTED_PATHS = {
    "kenning.activity": ["activity", "Activity"],
    "kenning.app": ["App", "EddaApp"],
    "kenning.children": ["start_child", "ChildHandle"],
    "kenning.client": ["Client", "StartedInstance"],
    "kenning.compensation": ["compensation", "on_failure", "register_compensation", "CompensationFailedError"],
    "kenning.context": ["WorkflowContext"],
    "kenning.errors": ["KenningError", "TerminalError", "RetryExhaustedError", "EventTimeoutError"],
    "kenning.events": ["wait_event", "ReceivedEvent"],
    "kenning.hooks": ["WorkflowHooks", "HooksBase"],
    "kenning.messages": [
        *("send_message", "receive", "publish", "subscribe", "ReceivedMessage"),
        *("publish_value", "set_status", "PublishedStatus"),
    ],
    "kenning.outbox": ["send_event_transactional"],
    "kenning.queues": ["Queue"],
    "kenning.flow": ["Debounce", "Batch", "RateLimit"],
    "kenning.retry": ["RetryPolicy"],
    "kenning.streams": ["write_stream", "close_stream", "StreamEntry"],
    "kenning.timers": ["wait_timer", "wait_until", "sleep", "sleep_until"],
    "kenning.workflow": ["workflow", "Workflow", "continue_as_new"],
    "kenning.examples.orders": ["app"],
    "kenning.testing": ["WorkflowEnvironment"],
}


def test_the_package_exports_exactly_the_frozen_names() -> None:
    assert sorted(kenning.__all__) == EXPORTS
    assert all(hasattr(kenning, name) for name in EXPORTS)


@pytest.mark.parametrize("module", sorted(DOCUMENTED_PATHS))
def test_every_documented_import_path_resolves(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in DOCUMENTED_PATHS[module] if not hasattr(imported, name)]
    assert missing == [], f"{module} lost {missing}"


def test_the_exported_objects_are_the_documented_ones() -> None:
    for module, names in DOCUMENTED_PATHS.items():
        imported = importlib.import_module(module)
        for name in names:
            if name in EXPORTS:
                assert getattr(imported, name) is getattr(kenning, name), f"{module}.{name}"
