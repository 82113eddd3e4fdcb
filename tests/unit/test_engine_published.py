"""Published values and search attributes in the engine, on the in-memory port (issue 29,
item 3): ``publish_value`` and ``set_status`` are steps (recorded ``ValuePublished``,
replay writes nothing again), the latest value per key wins, a declared search attribute
is indexed as text in the same write, and bad input is refused before any write. No
database (tests/system/test_published_values.py runs them through PostgreSQL and real
processes).

Before the feature ``publish_value``, ``set_status`` and ``@workflow(search_attributes=)``
did not exist.
"""

from __future__ import annotations

from typing import Any

import pytest

from kenning import (
    App,
    ConfigurationError,
    RetryPolicy,
    WorkflowContext,
    activity,
    publish_value,
    set_status,
    wait_event,
    workflow,
)
from kenning.core.limits import MAX_VALUE_CHARS
from kenning.core.names import VALUE_PUBLISHED
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

app = App()


@workflow(search_attributes=("customer", "vip", "score"))
async def engine_published_order(ctx: WorkflowContext, customer: str) -> str:
    await set_status(ctx, "received", progress=0)
    await publish_value(ctx, "customer", customer)
    await publish_value(ctx, "vip", True)
    await publish_value(ctx, "score", 2.5)
    await publish_value(ctx, "receipt", {"lines": [1, 2]})  # not declared: published, not indexed
    await set_status(ctx, "awaiting payment", progress=0.4)
    await wait_event(ctx, "paid")
    await publish_value(ctx, "vip", None)  # leaves the search
    await set_status(ctx, "done", progress=1)
    return "ok"


@workflow(search_attributes=("customer",))
async def engine_published_bad(ctx: WorkflowContext, what: str) -> None:
    values: dict[str, Any] = {
        "dict": {"a": 1},
        "big": "x" * MAX_VALUE_CHARS,
        "key": None,
    }
    if what == "progress":
        await set_status(ctx, "over", progress=1.5)
    elif what == "key":
        await publish_value(ctx, "", 1)
    elif what == "big":
        await publish_value(ctx, "blob", values["big"])
    else:
        await publish_value(ctx, "customer", values[what])


@activity(retry_policy=RetryPolicy(max_attempts=1))
async def publishes_inside(ctx: WorkflowContext) -> None:
    await publish_value(ctx, "inside", 1)


@workflow
async def engine_published_in_activity(ctx: WorkflowContext) -> None:
    await publishes_inside(ctx)


def _order(instance_id: str = "order-1") -> MemoryInstance:
    return MemoryInstance(id=instance_id, workflow_name="engine_published_order", input={"customer": "c-1"})


async def test_values_are_steps_the_latest_wins_and_replay_writes_nothing() -> None:
    instance = _order()
    assert await run_once(app, instance) is RunOutcome.SUSPENDED
    assert instance.values == {
        "status": {"text": "awaiting payment", "progress": 0.4},
        "customer": "c-1",
        "vip": True,
        "score": 2.5,
        "receipt": {"lines": [1, 2]},
    }
    assert instance.search_attributes == {"customer": "c-1", "vip": "true", "score": "2.5"}
    steps = [(r.step_id, r.kind, r.step_name) for r in instance.history]
    assert steps[:2] == [
        ("publish_value:1", VALUE_PUBLISHED, "publish_value:status"),
        ("publish_value:2", VALUE_PUBLISHED, "publish_value:customer"),
    ]
    assert len(steps) == 6 and {kind for _, kind, _ in steps} == {VALUE_PUBLISHED}

    # the event comes: the replay of the six publishes writes none of them again
    instance.values.clear()
    instance.search_attributes = {"customer": "c-1", "vip": "true", "score": "2.5"}
    writes_before = len(instance.writes)
    instance.deliver_event({"type": "paid", "source": "test", "id": "p-1", "data": {}})
    assert await run_once(app, instance) is RunOutcome.COMPLETED
    new_writes = instance.writes[writes_before:]
    assert [w for w in new_writes if w.startswith("publish value")] == [
        "publish value at publish_value:7",
        "publish value at publish_value:8",
    ]
    assert instance.values == {"vip": None, "status": {"text": "done", "progress": 1.0}}
    assert instance.search_attributes == {"customer": "c-1", "score": "2.5"}  # vip left the search


@pytest.mark.parametrize(
    ("what", "error"),
    [
        ("progress", "set_status progress must be a number in [0, 1]"),
        ("key", "a published value's key must be a non-empty str"),
        ("dict", "search attribute 'customer' takes a str, int, float or bool, not dict"),
        ("big", f"more than {MAX_VALUE_CHARS}"),
    ],
)
async def test_bad_values_fail_the_workflow_before_any_write(what: str, error: str) -> None:
    expect_log("instance.failed")
    instance = MemoryInstance(id=f"bad-{what}", workflow_name="engine_published_bad", input={"what": what})
    assert await run_once(app, instance) is RunOutcome.FAILED
    assert instance.error is not None and error in instance.error["message"], instance.error
    assert instance.values == {} and instance.search_attributes == {}
    assert not [r for r in instance.history if r.kind == VALUE_PUBLISHED]


def test_search_attributes_are_declared_as_keys() -> None:
    async def body(ctx: WorkflowContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match="takes a tuple of keys"):
        workflow(search_attributes="customer")(body)  # a str is a Sequence[str]: refused at run time
    with pytest.raises(ConfigurationError, match="not 'status'"):
        workflow(name="reserved_status", search_attributes=("status",))(body)
    assert workflow(name="declared", search_attributes=["a", "b"])(body).search_attributes == {"a", "b"}


async def test_a_publish_inside_an_activity_is_refused() -> None:
    expect_log("instance.failed")
    instance = MemoryInstance(id="inside-1", workflow_name="engine_published_in_activity", input={})
    outcomes = await run_until_rest(app, instance)
    assert outcomes[-1] is RunOutcome.FAILED, outcomes
    assert instance.values == {}
    assert instance.error is not None and "belong in workflow code" in str(instance.error), instance.error
