"""The in-memory port keeps what the database keeps of a wait (issue 27): ``match`` and
``since`` decide which event a subscription takes, and timeouts fire on its clock.

Before, ``MemoryInstance.deliver_event`` recorded any event for a waiting instance,
whatever its ``match``, and an event timeout could not be driven at all."""

from __future__ import annotations

from typing import Any

import pytest

from kenning import App, EventTimeoutError, WorkflowContext, wait_event, workflow
from kenning.core.names import EVENT_TIMEOUT
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once
from kenning.testing.memorystate import MemoryEvent, MemoryInstance, contains, stamp

app = App()


@workflow(name="memory_waits.correlated")
async def correlated(ctx: WorkflowContext, since: float | None = None) -> Any:
    try:
        event = await wait_event(ctx, "paid", timeout_seconds=300, match={"order_id": "o-1"}, since=since)
    except EventTimeoutError:
        return "timed out"
    return event.data


class Clock:
    def __init__(self) -> None:
        self.seconds = 1_000_000.0

    def __call__(self) -> float:
        return self.seconds


def event(data: Any, received: tuple[float, int], event_id: str = "e-1") -> MemoryEvent:
    payload = {"type": "paid", "source": "t", "id": event_id, "data": data}
    return MemoryEvent("paid", "t", event_id, data, received, payload=payload)


async def test_an_event_outside_the_match_is_not_delivered() -> None:
    instance = MemoryInstance("m-1", "memory_waits.correlated")
    assert await run_once(app, instance) is RunOutcome.SUSPENDED
    with pytest.raises(AssertionError, match="does not take this event"):
        instance.deliver_event({"type": "paid", "source": "t", "id": "e-2", "data": {"order_id": "o-2"}})
    assert instance.status == "waiting_for_event" and instance.history == []
    instance.deliver_event({"type": "paid", "source": "t", "id": "e-1", "data": {"order_id": "o-1", "amount": 4}})
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": {"order_id": "o-1", "amount": 4}}


async def test_an_event_timeout_fires_on_the_ports_clock() -> None:
    clock = Clock()
    instance = MemoryInstance("m-2", "memory_waits.correlated")
    assert await run_once(app, instance, clock=clock) is RunOutcome.SUSPENDED
    assert instance.due_at == clock.seconds + 300
    assert not instance.fire_due(clock.seconds + 299.9)  # never early
    assert instance.fire_due(clock.seconds + 300)
    assert instance.history[-1].kind == EVENT_TIMEOUT
    assert await run_once(app, instance, clock=clock) is RunOutcome.COMPLETED
    assert instance.result == {"result": "timed out"}


async def test_since_takes_an_event_received_before_the_wait_and_only_within_its_window() -> None:
    clock = Clock()
    instance = MemoryInstance("m-3", "memory_waits.correlated", {"since": 60})
    before = stamp(clock.seconds - 1)  # received a second before the wait began
    assert await run_once(app, instance, clock=clock) is RunOutcome.SUSPENDED
    assert instance.takes(event({"order_id": "o-1"}, before))
    assert not instance.takes(event({"order_id": "o-1"}, stamp(clock.seconds - 61)))  # before the window
    assert not instance.takes(event({"order_id": "o-2"}, before))  # outside the match

    plain = MemoryInstance("m-4", "memory_waits.correlated")
    assert await run_once(app, plain, clock=clock) is RunOutcome.SUSPENDED
    assert not plain.takes(event({"order_id": "o-1"}, before))  # without since: only after the wait
    assert plain.takes(event({"order_id": "o-1"}, stamp(clock.seconds)))


def test_containment_is_postgresqls() -> None:
    assert contains({"a": 1, "b": {"c": [1, 2, 3]}}, {"b": {"c": [3, 1]}})
    assert not contains({"a": 1}, {"a": 1, "b": 2})
    assert not contains({"a": True}, {"a": 1})
    assert contains([1, 2], 1) and not contains({"a": [1]}, {"a": 1})  # a scalar in an array: at the top only
    assert not contains([[1, 2]], [1]) and not contains([1, [2]], [2])
