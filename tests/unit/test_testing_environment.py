"""``kenning.testing.WorkflowEnvironment`` in memory (issue 27, item 1): the order saga's
four paths, time that skips only when everything waits, retries' back-offs skipped,
children, messages, overrides. The same scenarios run on PostgreSQL in
tests/integration/test_port_contract.py."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from kenning import WorkflowContext, WorkflowFailedError
from kenning.core.names import ACTIVITY_COMPLETED, EVENT_RECEIVED, EVENT_TIMEOUT, TIMER_EXPIRED
from kenning.examples import orders
from kenning.testing import WaitsForeverError, WorkflowEnvironment
from tests.apps import contract
from tests.logguard import expect_log

ORDER = {"order_id": "o-1", "items": [{"sku": "book", "qty": 1}], "amount": 42}


def order(order_id: str) -> orders.OrderCreated:
    """The saga's input, typed as its workflow takes it (env.start is checked against it)."""
    return orders.OrderCreated.model_validate({**ORDER, "order_id": order_id})


def kinds(history: Any) -> list[str]:
    return [entry.kind for entry in history]


async def test_the_order_sagas_four_paths_run_in_memory_in_under_a_second() -> None:
    """Paid, declined, timed out and cancelled, in one environment: the payment timeout
    (300 s) and the cooling-off timer are skipped, not waited for."""
    expect_log("instance.failed")  # the declined and the timed-out orders
    started = time.perf_counter()
    async with WorkflowEnvironment(orders.app) as env:
        paid = await env.start(orders.order_saga, order=order("o-1"))
        await env.send_event("payment.completed", {"order_id": "o-1", "status": "approved"})
        await env.sleep(timedelta(minutes=11))
        assert await paid.result() == {"order_id": "o-1", "tracking": "trk-o-1"}

        declined = await env.start(orders.order_saga, order=order("o-2"))
        await env.send_event("payment.completed", {"order_id": "o-2", "status": "declined"})
        with pytest.raises(WorkflowFailedError, match="was declined"):
            await declined.result()

        timed_out = await env.start(orders.order_saga, order=order("o-3"))
        with pytest.raises(WorkflowFailedError, match="no payment for order o-3 within 300 s"):
            await timed_out.result()
        assert EVENT_TIMEOUT in kinds(await timed_out.history())

        cancelled = await env.start(orders.order_saga, order=order("o-4"))
        assert await cancelled.cancel()
        assert await cancelled.status() == "cancelled"
        # each failed path released the reserved inventory
        for handle in (declined, timed_out, cancelled):
            assert kinds(await handle.history())[-1] == "CompensationExecuted"
        assert [e.data["order_id"] for e in await env.outbox()] == ["o-1", "o-2", "o-3", "o-4"]
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"the four paths took {elapsed:.3f} s"


async def test_an_event_for_another_order_does_not_wake_the_saga() -> None:
    async with WorkflowEnvironment(orders.app) as env:
        handle = await env.start(orders.order_saga, order=order("o-1"))
        await env.send_event("payment.completed", {"order_id": "o-9", "status": "approved"})
        assert await handle.status() == "waiting_for_event"
        await env.send_event("payment.completed", {"order_id": "o-1", "status": "approved"})
        assert (await handle.result())["tracking"] == "trk-o-1"


async def test_since_takes_an_event_sent_before_the_wait_within_its_window_only() -> None:
    expect_log("instance.failed")
    async with WorkflowEnvironment(contract.app) as env:
        await env.send_event("paid", {"order_id": "early", "amount": 1})
        handle = await env.start(contract.waits, order_id="early", timeout=60, since=30)
        assert await handle.result() == {"order_id": "early", "amount": 1}

        await env.send_event("paid", {"order_id": "stale", "amount": 2})
        await env.sleep(31)  # the event is now older than the window
        stale = await env.start(contract.waits, order_id="stale", timeout=60, since=30)
        with pytest.raises(WorkflowFailedError, match="was not paid"):
            await stale.result()

        plain = await env.start(contract.waits, order_id="early", timeout=60)  # no since: only later events
        assert await plain.status() == "waiting_for_event"


async def test_sleep_fires_due_waits_in_order_and_only_those_due() -> None:
    async with WorkflowEnvironment(contract.app) as env:
        handle = await env.start(contract.timers)
        began = env.now()
        await env.sleep(9.9)
        assert kinds(await handle.history()) == []
        await env.sleep(0.1)
        assert kinds(await handle.history()) == [TIMER_EXPIRED, ACTIVITY_COMPLETED]
        await env.sleep(timedelta(hours=1))
        assert await handle.result() == ["charged 5"]
        assert env.now() - began == timedelta(seconds=3610)


async def test_retry_back_offs_are_skipped_and_max_duration_counts_virtual_time() -> None:
    expect_log("instance.failed")
    async with WorkflowEnvironment(contract.app) as env:
        retried = await env.start(contract.retries, failures=3)
        began = env.now()
        assert await retried.result() == 4  # attempts 1-3 failed, the 4th answered
        assert env.now() - began == timedelta(seconds=30 + 60 + 60)  # the third capped by max_interval

        gave_up = await env.start(contract.gives_up)
        with pytest.raises(WorkflowFailedError, match="failed after 3 attempts"):
            await gave_up.result()
        assert contract.UNDONE[-1] == f"room {gave_up.instance_id}"

        deadline = await env.start(contract.deadline)
        with pytest.raises(WorkflowFailedError, match="RetryExhaustedError"):
            await deadline.result()
        assert contract.ATTEMPTS[f"until_deadline {deadline.instance_id}"] == 4  # at 0, 60, 120, 180 s


async def test_a_workflow_timeout_fires_on_the_skipped_clock() -> None:
    """A deadline is a due time like a timer's: skipped to, fired, the saga undone."""
    expect_log("instance.timed_out")
    async with WorkflowEnvironment(contract.app) as env:
        handle = await env.start(contract.bounded)
        began = env.now()
        with pytest.raises(WorkflowFailedError, match="WorkflowTimeoutError"):
            await handle.result()
        assert env.now() - began == timedelta(seconds=600)
        assert contract.UNDONE[-1] == f"bounded {handle.instance_id}"
        assert kinds(await handle.history())[-1] == "CompensationExecuted"

        early = await env.start(contract.bounded.options(timeout=30))
        await env.sleep(29)
        assert await early.status() == "waiting_for_event"
        await env.sleep(1)
        assert await early.status() == "failed"

        parent = await env.start(contract.bounds_a_child, seconds=45)
        began = env.now()
        assert await parent.result() == "kenning.errors.WorkflowTimeoutError"  # the child's, from its start
        assert env.now() - began == timedelta(seconds=45)


async def test_a_heartbeat_timeout_stops_a_hung_attempt_and_the_retry_resumes() -> None:
    expect_log("activity.heartbeat_timed_out")
    async with WorkflowEnvironment(contract.app) as env:
        handle = await env.start(contract.heartbeats, rows=4)
        began = env.now()
        assert await handle.result() == [2, 4]  # the second attempt began at row 2
        assert contract.ATTEMPTS[f"resumable {handle.instance_id}"] == 2
        assert env.now() - began == timedelta(seconds=5)  # the back-off skipped, not waited


async def test_a_child_workflow_and_its_parent() -> None:
    expect_log("instance.failed")
    async with WorkflowEnvironment(contract.app) as env:
        handle = await env.start(contract.parent, seconds=7200)
        assert await handle.result() == "slept 7200"
        assert len(await env.instances()) == 2
        failing = await env.start(contract.parent, seconds=5, fail=True)
        with pytest.raises(WorkflowFailedError, match="the child gave up"):
            await failing.result()


async def test_messages_a_receive_timeout_and_a_publish() -> None:
    async with WorkflowEnvironment(contract.app) as env:
        receiving = await env.start(contract.receiver)
        await receiving.send_message("items", {"n": 1})
        assert await receiving.result() == [{"n": 1}, "timed out"]

        listening = await env.start(contract.listener)
        assert await env.publish("news", "headline") == 1
        assert await listening.result() == "headline"


async def test_a_continue_as_new_chain_runs_to_its_end_and_the_result_is_the_last_runs() -> None:
    """Three runs of one instance (issue 29, item 1); the same on PostgreSQL:
    tests/integration/test_port_contract.py."""
    async with WorkflowEnvironment(contract.app) as env:
        chain = await env.start(contract.chain, per_run=2, runs=3)
        await chain.send_message("numbers", 1)
        await env.settle()
        assert (await chain.state()).run == 1  # waits for its second message
        for n in range(2, 7):
            await chain.send_message("numbers", n)
        assert await chain.result() == {"total": 21, "run": 3}
        state = await chain.state()
        assert state.run == 3
        assert kinds(state.history) == ["MessageReceived", "MessageReceived"]  # run 3's alone


async def test_an_event_starts_its_event_handler_workflow_once() -> None:
    async with WorkflowEnvironment(contract.app) as env:
        assert await env.send_event("contract.started_by_event", {"order_id": "abc"}, event_id="e-1")
        assert not await env.send_event("contract.started_by_event", {"order_id": "abc"}, event_id="e-1")
        (handle,) = await env.instances()
        assert await handle.result() == "charged 3"


async def test_an_addressed_event_reaches_only_its_instance() -> None:
    async with WorkflowEnvironment(contract.app) as env:
        one, two = await env.start(contract.any_event), await env.start(contract.any_event)
        await env.send_event("ping", "for two", instance_id=two.instance_id)
        assert await two.result() == "for two"
        assert await one.status() == "waiting_for_event"


async def test_override_replaces_an_activity_until_the_environment_closes() -> None:
    async def fake_charge(ctx: WorkflowContext, amount: int) -> str:
        return f"faked {amount}"

    async with WorkflowEnvironment(contract.app) as env:
        env.override(contract.charge, fake_charge)
        handle = await env.start(contract.timers)
        assert await handle.result() == ["faked 5"]
        assert (await handle.history())[-1].step_name == "charge"  # history keeps the activity's name
    assert contract.charge.func is not fake_charge


async def test_result_of_an_instance_nothing_can_wake_says_so() -> None:
    async with WorkflowEnvironment(contract.app) as env:
        handle = await env.start(contract.listener)
        with pytest.raises(WaitsForeverError, match="waits for an event or a message"):
            await handle.result()


async def test_misuse_is_a_clear_error() -> None:
    env = WorkflowEnvironment(contract.app)
    with pytest.raises(RuntimeError, match="not open"):
        await env.start(contract.timers)
    async with env:
        with pytest.raises(ValueError, match="reserved"):
            await env.send_event("kenning.child.finished", {})
        with pytest.raises(TypeError, match="neither an @activity"):
            env.override(print, print)
        with pytest.raises(ValueError, match="must not be negative"):
            await env.sleep(-1)


async def test_the_pytest_fixture_gives_an_in_memory_environment(workflow_env: WorkflowEnvironment) -> None:
    assert workflow_env.mode == "memory"
    handle = await workflow_env.start(contract.any_event)
    await workflow_env.send_event("ping", 1)
    assert await handle.result() == 1
    assert [e.kind for e in await handle.history()] == [EVENT_RECEIVED]
