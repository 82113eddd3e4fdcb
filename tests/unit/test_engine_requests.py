"""Requests with a reply on the in-memory port: ``message.reply`` is a step, recorded once
with its reply row; replay replies nothing again; a second reply is a recorded error.
No database (tests/integration/test_requests.py and tests/system/test_requests.py run
the same through PostgreSQL and real processes)."""

from __future__ import annotations

from collections import Counter

import pytest

from kenning import App, MessageAlreadyRepliedError, WorkflowContext, activity, receive, wait_timer, workflow
from kenning.core.limits import MAX_REPLY_BYTES
from kenning.core.names import ACTIVITY_COMPLETED, ACTIVITY_FAILED, MESSAGE_RECEIVED, MESSAGE_REPLIED
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance

app = App()
DECIDED: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def fresh() -> None:
    DECIDED.clear()


@activity
async def decide(ctx: WorkflowContext, amount: int) -> bool:
    DECIDED[str(amount)] += 1
    return amount < 100


@workflow
async def engine_approver(ctx: WorkflowContext) -> str:
    request = await receive(ctx, "approve")
    approved = await decide(ctx, request.data["amount"])
    await request.reply(ctx, {"approved": approved})
    await wait_timer(ctx, 1)  # the next run replays the reply
    return "done"


@workflow
async def engine_double_reply(ctx: WorkflowContext) -> str:
    request = await receive(ctx, "approve")
    await request.reply(ctx, 1)
    try:
        await request.reply(ctx, 2)
    except MessageAlreadyRepliedError as error:
        await wait_timer(ctx, 1)  # the next run replays the refusal
        return f"refused: {error}"
    return "replied twice"


@workflow
async def engine_rejecter(ctx: WorkflowContext) -> None:
    request = await receive(ctx, "approve")
    await request.reply_error(ctx, "over budget")


@workflow
async def engine_huge_reply(ctx: WorkflowContext) -> str:
    request = await receive(ctx, "approve")
    try:
        await request.reply(ctx, "x" * MAX_REPLY_BYTES)
    except ValueError as error:
        await request.reply(ctx, "too big")
        return str(error)
    return "sent"


def instance(workflow_name: str) -> MemoryInstance:
    return MemoryInstance(id=f"{workflow_name}-1", workflow_name=workflow_name)


async def test_a_reply_is_a_step_recorded_once_with_its_reply_row() -> None:
    approver = instance("engine_approver")
    assert approver.send_message("approve", {"amount": 5}, message_id="req-1") is None
    assert await run_until_rest(app, approver) == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert [(r.step_id, r.kind, r.step_name) for r in approver.history][:3] == [
        ("receive:1", MESSAGE_RECEIVED, "receive:approve"),
        ("decide:1", ACTIVITY_COMPLETED, "decide"),
        ("reply:1", MESSAGE_REPLIED, "reply:approve"),
    ]
    assert approver.history[2].payload == {"message_id": "req-1", "topic": "approve", "rejected": False}
    assert approver.replies == {"req-1": ({"approved": True}, None)}
    assert DECIDED == {"5": 1}


async def test_replay_replies_nothing_again() -> None:
    approver = instance("engine_approver")
    approver.send_message("approve", {"amount": 500}, message_id="req-1")
    await run_until_rest(app, approver)
    # a fresh run over the same history (a worker after a crash): the reply is replayed
    again = instance("engine_approver")
    again.history = list(approver.history)
    assert await run_once(app, again) is RunOutcome.COMPLETED  # every step replayed
    assert again.replies == {}  # no reply row written by the replay
    assert [r.kind for r in again.history].count(MESSAGE_REPLIED) == 1
    assert DECIDED == {"500": 1}


async def test_a_second_reply_to_a_message_is_a_recorded_error() -> None:
    doubled = instance("engine_double_reply")
    doubled.send_message("approve", None, message_id="req-2")
    assert await run_until_rest(app, doubled) == [RunOutcome.SUSPENDED, RunOutcome.COMPLETED]
    assert doubled.replies == {"req-2": (1, None)}  # the first reply stands
    result = (doubled.result or {})["result"]
    assert result.startswith("refused: message 'req-2' ('approve') of instance engine_double_reply-1")
    assert [(r.step_id, r.kind) for r in doubled.history][1:3] == [
        ("reply:1", MESSAGE_REPLIED),
        ("reply:2", ACTIVITY_FAILED),
    ]


async def test_a_refusal_is_stored_as_the_replys_error() -> None:
    rejecter = instance("engine_rejecter")
    rejecter.send_message("approve", None, message_id="req-3")
    assert await run_until_rest(app, rejecter) == [RunOutcome.COMPLETED]
    assert rejecter.replies == {"req-3": (None, "over budget")}
    assert rejecter.history[-1].payload["rejected"] is True


async def test_a_reply_over_the_size_limit_is_refused_before_it_is_a_step() -> None:
    huge = instance("engine_huge_reply")
    huge.send_message("approve", None, message_id="req-4")
    assert await run_until_rest(app, huge) == [RunOutcome.COMPLETED]
    assert (
        "more than 1048576" in (huge.result or {})["result"] and "KENNING_OBJECT_STORE" in (huge.result or {})["result"]
    )
    assert huge.replies == {"req-4": ("too big", None)}
    assert [r.step_id for r in huge.history] == ["receive:1", "reply:2"]  # the refused one took reply:1
