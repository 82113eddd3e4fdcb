"""Messages on the in-memory port: mailbox order, waiting and waking, replay, timeouts,
refused sends, workflow-to-workflow ping-pong. No database (tests/system/test_messages.py runs
the same through PostgreSQL and real processes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kenning import (
    App,
    EventTimeoutError,
    MessageUndeliverableError,
    WorkflowContext,
    WorkflowNotFoundError,
    activity,
    publish,
    receive,
    send_message,
    subscribe,
    wait_timer,
    workflow,
)
from kenning.core.mailbox import Undelivered
from kenning.core.names import ACTIVITY_COMPLETED, ACTIVITY_FAILED, MESSAGE_RECEIVED, MESSAGE_SENT, MESSAGE_TIMEOUT
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance

app = App()
HANDLED: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh() -> None:
    HANDLED.clear()


@activity
async def handle(ctx: WorkflowContext, data: Any) -> Any:
    HANDLED[str(data)] += 1
    return data


@workflow
async def engine_collect(ctx: WorkflowContext, count: int) -> list[Any]:
    return [await handle(ctx, (await receive(ctx, "items")).data) for _ in range(count)]


@workflow
async def engine_two_topics(ctx: WorkflowContext) -> list[Any]:
    first = await receive(ctx, "b")
    second = await receive(ctx, "a")
    return [first.data, second.data]


@workflow
async def engine_sends(ctx: WorkflowContext, to: str) -> str:
    message_id = await send_message(ctx, to, "items", {"from": ctx.instance_id})
    await wait_timer(ctx, 1)  # a second run replays the send
    return message_id


@workflow
async def engine_sends_nowhere(ctx: WorkflowContext, to: str) -> str:
    try:
        await send_message(ctx, to, "items", 1)
    except WorkflowNotFoundError as error:
        await wait_timer(ctx, 1)  # the second run replays the refusal
        return f"refused: {error}"
    except MessageUndeliverableError as error:
        return f"ended: {error}"
    return "sent"


@workflow
async def engine_patient(ctx: WorkflowContext) -> list[Any]:
    outcome: list[Any] = []
    try:
        await receive(ctx, "answer", timeout_seconds=5)
    except EventTimeoutError:
        outcome.append("timed out")
    outcome.append((await receive(ctx, "answer")).data)
    return outcome


@workflow
async def engine_ping(ctx: WorkflowContext, peer: str, rounds: int) -> list[Any]:
    answers = []
    for n in range(rounds):
        await send_message(ctx, peer, "ping", n)
        answers.append((await receive(ctx, "pong")).data)
    return answers


@workflow
async def engine_pong(ctx: WorkflowContext, rounds: int) -> int:
    for _ in range(rounds):
        ping = await receive(ctx, "ping")
        assert ping.sender is not None
        await send_message(ctx, ping.sender, "pong", ping.data * 10)
    return rounds


def instance(workflow_name: str, instance_id: str | None = None, **input: Any) -> MemoryInstance:
    return MemoryInstance(id=instance_id or f"{workflow_name}-1", workflow_name=workflow_name, input=input)


def connect(*instances: MemoryInstance) -> None:
    """Let each send to the others by id (one directory, as the instances table is)."""
    directory = {i.id: i for i in instances}
    for i in instances:
        i.peers = directory


async def test_messages_sent_before_the_receiver_waits_are_received_in_order() -> None:
    receiver = instance("engine_collect", count=3)
    for n in (1, 2, 3):
        assert receiver.send_message("items", n) is None
    assert await run_until_rest(app, receiver) == [RunOutcome.COMPLETED]
    assert receiver.result == {"result": [1, 2, 3]}
    received = [r for r in receiver.history if r.kind == MESSAGE_RECEIVED]
    assert [r.step_id for r in received] == ["receive:1", "receive:2", "receive:3"]
    assert [r.payload["data"] for r in received] == [1, 2, 3]
    assert [m.consumed_step_id for m in receiver.mailbox] == ["receive:1", "receive:2", "receive:3"]


async def test_a_waiting_receiver_is_woken_by_a_message_of_its_topic_only() -> None:
    receiver = instance("engine_two_topics")
    assert await run_until_rest(app, receiver) == [RunOutcome.SUSPENDED]
    assert receiver.status == "waiting_for_message" and receiver.receiving is not None
    receiver.send_message("a", "for a")  # not the topic it waits for: it sleeps on
    assert receiver.status == "waiting_for_message"
    receiver.send_message("b", "for b")
    assert receiver.status == "pending"
    # the second receive finds its message already there: no suspend
    assert await run_once(app, receiver) is RunOutcome.COMPLETED
    assert receiver.result == {"result": ["for b", "for a"]}


async def test_replay_returns_the_recorded_message_not_the_mailbox() -> None:
    receiver = instance("engine_collect", count=2)
    receiver.send_message("items", "first")
    assert await run_until_rest(app, receiver) == [RunOutcome.SUSPENDED]
    receiver.send_message("items", "second")
    assert await run_until_rest(app, receiver) == [RunOutcome.COMPLETED]
    # a fresh run over the same history (a worker after a crash) reads the records back
    again = instance("engine_collect", count=2)
    again.history = list(receiver.history)
    assert await run_once(app, again) is RunOutcome.COMPLETED
    assert again.result == {"result": ["first", "second"]}
    assert HANDLED == {"first": 1, "second": 1}  # the activities replayed too


async def test_a_send_is_a_step_made_once_however_often_the_workflow_replays() -> None:
    receiver = instance("engine_collect", count=1)
    sender = instance("engine_sends", to=receiver.id)
    connect(sender, receiver)
    assert await run_until_rest(app, sender) == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert sender.result == {"result": f"{sender.id}:send_message:1"}
    assert [(r.step_id, r.kind, r.step_name) for r in sender.history][:1] == [
        ("send_message:1", MESSAGE_SENT, "send_message:items")
    ]
    assert len(receiver.mailbox) == 1 and receiver.mailbox[0].sender == sender.id
    assert receiver.mailbox[0].message_id == f"{sender.id}:send_message:1"
    assert await run_until_rest(app, receiver) == [RunOutcome.COMPLETED]
    assert receiver.result == {"result": [{"from": sender.id}]}


async def test_a_send_to_an_unknown_or_ended_instance_is_the_workflows_error_recorded_once() -> None:
    sender = instance("engine_sends_nowhere", to="nobody")
    assert await run_until_rest(app, sender) == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert sender.result == {"result": "refused: no workflow instance 'nobody' to send message 'items' to"}
    assert (sender.history[0].step_id, sender.history[0].kind) == ("send_message:1", ACTIVITY_FAILED)

    ended = instance("engine_collect", count=0)
    assert await run_until_rest(app, ended) == [RunOutcome.COMPLETED]
    assert ended.send_message("items", 1) is Undelivered.FINISHED
    late = instance("engine_sends_nowhere", to=ended.id)
    connect(late, ended)
    assert await run_until_rest(app, late) == [RunOutcome.COMPLETED]
    assert late.result is not None and "has ended (completed)" in late.result["result"]
    assert ended.mailbox == []


async def test_a_receive_times_out_and_a_later_message_waits_for_the_next_receive() -> None:
    receiver = instance("engine_patient")
    assert await run_until_rest(app, receiver) == [RunOutcome.SUSPENDED]
    receiver.time_out_receive()
    assert await run_until_rest(app, receiver) == [RunOutcome.SUSPENDED]  # the second receive waits
    assert [(r.step_id, r.kind) for r in receiver.history] == [("receive:1", MESSAGE_TIMEOUT)]
    receiver.send_message("answer", 42)
    assert await run_until_rest(app, receiver) == [RunOutcome.COMPLETED]
    assert receiver.result == {"result": ["timed out", 42]}


async def test_two_workflows_play_ping_pong() -> None:
    ping = instance("engine_ping", peer="engine_pong-1", rounds=3)
    pong = instance("engine_pong", rounds=3)
    connect(ping, pong)
    for _ in range(20):  # a tiny scheduler: run whichever is runnable
        runnable = [i for i in (ping, pong) if i.status == "pending"]
        if not runnable:
            break
        for i in runnable:
            await run_once(app, i)
    assert (ping.status, pong.status) == ("completed", "completed")
    assert ping.result == {"result": [0, 10, 20]}
    kinds = Counter(r.kind for r in ping.history)
    assert kinds == {MESSAGE_SENT: 3, MESSAGE_RECEIVED: 3}
    assert all(m.consumed_step_id is not None for m in ping.mailbox + pong.mailbox)
    assert ACTIVITY_COMPLETED not in kinds


@workflow
async def engine_listen(ctx: WorkflowContext, count: int) -> list[Any]:
    await subscribe(ctx, "news")
    return [(await receive(ctx, "news")).data for _ in range(count)]


@workflow
async def engine_broadcast(ctx: WorkflowContext, items: list[Any]) -> list[int]:
    return [await publish(ctx, "news", item) for item in items]


async def test_a_publish_reaches_every_subscriber_once_and_replays_its_count() -> None:
    first, second = instance("engine_listen", "l-1", count=2), instance("engine_listen", "l-2", count=2)
    late = instance("engine_listen", "l-3", count=1)  # subscribes after the first publish
    caster = instance("engine_broadcast", items=["a", "b"])
    connect(first, second, late, caster)
    for listener in (first, second):
        assert await run_until_rest(app, listener) == [RunOutcome.SUSPENDED]
    caster_first = await run_once(app, caster)
    assert caster_first is RunOutcome.COMPLETED
    assert caster.result == {"result": [2, 2]}
    assert [(r.step_id, r.kind, r.payload["subscribers"]) for r in caster.history] == [
        ("publish:1", MESSAGE_SENT, 2),
        ("publish:2", MESSAGE_SENT, 2),
    ]
    for listener in (first, second):
        assert listener.status == "pending"
        assert await run_until_rest(app, listener) == [RunOutcome.COMPLETED]
        assert listener.result == {"result": ["a", "b"]}
    assert await run_until_rest(app, late) == [RunOutcome.SUSPENDED]  # nothing published since
    assert late.mailbox == []
    # a replay of the publisher reads its counts back and publishes nothing again
    again = instance("engine_broadcast", items=["a", "b"])
    again.history = list(caster.history)
    assert await run_once(app, again) is RunOutcome.COMPLETED and again.result == {"result": [2, 2]}
    assert [len(i.mailbox) for i in (first, second, late)] == [2, 2, 0]
