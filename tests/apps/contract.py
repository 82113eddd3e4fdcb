"""Workflows ``kenning.testing``'s tests run on both backends (tests/unit/test_testing_*.py,
tests/integration/test_port_contract.py): every kind of wait, retries with long back-offs,
children, messages, compensations. Activities count their attempts in ``ATTEMPTS`` (the
environment runs them in this process, in memory and on PostgreSQL alike)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kenning import (
    App,
    ChildWorkflowFailed,
    EventTimeoutError,
    RetryPolicy,
    StreamClosedError,
    TerminalError,
    WorkflowContext,
    activity,
    close_stream,
    compensation,
    continue_as_new,
    on_failure,
    publish,
    publish_value,
    receive,
    send_message,
    set_status,
    start_child,
    subscribe,
    wait_event,
    wait_timer,
    workflow,
    write_stream,
)

app = App("kenning-contract-tests")

ATTEMPTS: Counter[str] = Counter()  # "<activity> <instance id>" -> attempts made
UNDONE: list[str] = []  # compensations run, "<what> <instance id>"


@compensation
async def unbook(ctx: WorkflowContext, what: str) -> None:
    UNDONE.append(f"{what} {ctx.instance_id}")


@activity
@on_failure(unbook)
async def book(ctx: WorkflowContext, what: str) -> str:
    return f"booked {what}"


@activity(retry_policy=RetryPolicy(initial_interval=30.0, backoff_coefficient=2.0, max_attempts=5, max_duration=None))
async def flaky(ctx: WorkflowContext, failures: int) -> int:
    """Fails ``failures`` times, then answers its attempt: back-offs of 30, 60, 60 s (max_interval)."""
    key = f"flaky {ctx.instance_id}"
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= failures:
        raise ConnectionError(f"attempt {ATTEMPTS[key]} refused")
    return ATTEMPTS[key]


@activity(retry_policy=RetryPolicy(initial_interval=10.0, max_attempts=3, max_duration=None))
async def always_fails(ctx: WorkflowContext) -> None:
    ATTEMPTS[f"always_fails {ctx.instance_id}"] += 1
    raise ConnectionError("the service is down")


@activity(retry_policy=RetryPolicy(initial_interval=60.0, max_attempts=None, max_duration=150.0))
async def until_deadline(ctx: WorkflowContext) -> None:
    """Retried every 60 s until 150 s have passed since its first failure."""
    ATTEMPTS[f"until_deadline {ctx.instance_id}"] += 1
    raise ConnectionError("still down")


@activity
async def charge(ctx: WorkflowContext, amount: int) -> str:
    return f"charged {amount}"


@workflow(name="contract.retries")
async def retries(ctx: WorkflowContext, failures: int) -> int:
    await book(ctx, "seat")
    return await flaky(ctx, failures)


@workflow(name="contract.gives_up")
async def gives_up(ctx: WorkflowContext) -> None:
    await book(ctx, "room")
    await always_fails(ctx)


@workflow(name="contract.deadline")
async def deadline(ctx: WorkflowContext) -> None:
    await until_deadline(ctx)


@workflow(name="contract.bounded", timeout=600)
async def bounded(ctx: WorkflowContext) -> None:
    """Books, then waits for an event that never comes: its workflow timeout ends it."""
    await book(ctx, "bounded")
    await wait_event(ctx, "never")


@workflow(name="contract.bounds_a_child")
async def bounds_a_child(ctx: WorkflowContext, seconds: float | None = None) -> Any:
    """A child with its workflow's timeout, or ``seconds`` of its own: its timeout fails it."""
    child = bounded if seconds is None else bounded.options(timeout=seconds)
    handle = await start_child(ctx, child)
    try:
        return await handle.result()
    except ChildWorkflowFailed as failed:
        return failed.error["type"] if failed.error else failed.status


@activity(heartbeat_timeout=0.5, retry_policy=RetryPolicy(initial_interval=5.0, max_attempts=3))
async def resumable(ctx: WorkflowContext, rows: int) -> list[int]:
    """Heartbeats a checkpoint per row; the first attempt hangs at row 2 and is stopped by
    its heartbeat timeout; the next resumes from the checkpoint. (first row, rows)."""
    first: int = ctx.heartbeat_details or 0
    ATTEMPTS[f"resumable {ctx.instance_id}"] += 1
    for n in range(first, rows):
        if n == 2 and first == 0:
            await asyncio.sleep(60)  # hung: no heartbeat
        ctx.heartbeat(n + 1)
    return [first, rows]


@workflow(name="contract.heartbeats")
async def heartbeats(ctx: WorkflowContext, rows: int) -> list[int]:
    return await resumable(ctx, rows)


@workflow(name="contract.entity", search_attributes=("owner",))
async def entity(ctx: WorkflowContext, owner: str, run: int = 1, bumps: int = 0) -> int:
    """Issue 29's parts together: a request answered per run, its status published, and a
    continue_as_new to the next run; values and the search carry over the chain."""
    if run == 1:
        await publish_value(ctx, "owner", owner)
    await set_status(ctx, f"run {run}", progress=run / 3)
    request = await receive(ctx, "bump")
    await request.reply(ctx, {"run": run, "bumps": bumps + 1})
    if run < 3:
        await continue_as_new(ctx, owner=owner, run=run + 1, bumps=bumps + 1)
    return bumps + 1


@workflow(name="contract.tagged", search_attributes=("tenant", "tier"))
async def tagged(ctx: WorkflowContext, children: int = 0) -> None:
    """Search attributes set by its start (and its children's starts), then a wait."""
    for n in range(children):
        await start_child(ctx, tagged.options(search_attributes={"tenant": f"{ctx.instance_id}-{n}", "tier": n}))
    await wait_timer(ctx, 60 if children else 30)  # a child ends before its parent: no race


@workflow(name="contract.timers")
async def timers(ctx: WorkflowContext) -> list[str]:
    await wait_timer(ctx, 10)
    await book(ctx, "after 10 s")
    await wait_timer(ctx, 3600)
    return [await charge(ctx, 5)]


@workflow(name="contract.waits")
async def waits(ctx: WorkflowContext, order_id: str, timeout: float, since: float | None = None) -> Any:
    """A correlated wait: only this order's event, maybe one received before, or a timeout."""
    await book(ctx, order_id)
    try:
        event = await wait_event(ctx, "paid", timeout_seconds=timeout, match={"order_id": order_id}, since=since)
    except EventTimeoutError:
        raise TerminalError(f"order {order_id} was not paid") from None
    return event.data


@workflow(name="contract.any_event")
async def any_event(ctx: WorkflowContext) -> Any:
    """A wait without match: any event of the type (or only one addressed to this instance)."""
    event = await wait_event(ctx, "ping", timeout_seconds=60)
    return event.data


@workflow(name="contract.started_by_event", event_handler=True)
async def started_by_event(ctx: WorkflowContext, order_id: str) -> str:
    return await charge(ctx, len(order_id))


@workflow(name="contract.child")
async def child(ctx: WorkflowContext, seconds: float, fail: bool = False) -> str:
    await wait_timer(ctx, seconds)
    if fail:
        raise TerminalError("the child gave up")
    return f"slept {seconds:g}"


@workflow(name="contract.parent")
async def parent(ctx: WorkflowContext, seconds: float, fail: bool = False) -> str:
    await book(ctx, "parent")
    # an id of its own: the contract suite names instances by id on both backends
    handle = await start_child(ctx, child, seconds=seconds, fail=fail, child_id=f"{ctx.instance_id}.child")
    return await handle.result()


@workflow(name="contract.receiver")
async def receiver(ctx: WorkflowContext) -> list[Any]:
    """Two receives: the first takes a message, the second times out."""
    got = [(await receive(ctx, "items", timeout_seconds=60)).data]
    try:
        got.append((await receive(ctx, "items", timeout_seconds=60)).data)
    except EventTimeoutError:
        got.append("timed out")
    return got


@workflow(name="contract.listener")
async def listener(ctx: WorkflowContext) -> Any:
    await subscribe(ctx, "news")
    return (await receive(ctx, "news")).data


@workflow(name="contract.announcer")
async def announcer(ctx: WorkflowContext, to: str) -> int:
    await send_message(ctx, to, "items", {"from": "announcer"})
    return await publish(ctx, "news", "extra")


@workflow(name="contract.cancellable")
async def cancellable(ctx: WorkflowContext) -> None:
    await book(ctx, "table")
    await charge(ctx, 3)
    await wait_timer(ctx, 86400)


@workflow(name="contract.published", search_attributes=("customer", "vip"))
async def published(ctx: WorkflowContext, customer: str, fail: bool = False) -> None:
    await set_status(ctx, "started", progress=0.1)
    await publish_value(ctx, "customer", customer)
    await publish_value(ctx, "vip", customer.endswith("1"))
    await publish_value(ctx, "detail", {"lines": [1, 2]})
    await wait_timer(ctx, 60)
    await publish_value(ctx, "detail", None)  # the latest wins
    await set_status(ctx, "done", progress=1)
    if fail:
        raise TerminalError("failed after publishing")


@workflow(name="contract.chain")
async def chain(ctx: WorkflowContext, per_run: int, runs: int, total: int = 0, run: int = 1) -> dict[str, int]:
    """continue_as_new: ``per_run`` messages a run, ``runs`` runs, the sum carried along."""
    for _ in range(per_run):
        total += int((await receive(ctx, "numbers")).data)
    if run < runs:
        await continue_as_new(ctx, per_run=per_run, runs=runs, total=total, run=run + 1)
    return {"total": total, "run": run}


@workflow(name="contract.endless")
async def endless(ctx: WorkflowContext, run: int = 1) -> None:
    """A chain that never waits: only a workflow timeout ends it (issue 33, item 6)."""
    await continue_as_new(ctx, run=run + 1)


@activity(retry_policy=RetryPolicy(initial_interval=5.0, max_attempts=3, max_duration=None))
async def speak(ctx: WorkflowContext, words: list[str]) -> int:
    """Streams its words; the first attempt is cut off after the first one."""
    key = f"speak {ctx.instance_id}"
    ATTEMPTS[key] += 1
    for n, word in enumerate(words):
        await write_stream(ctx, "talk", word, publish=True)
        if ATTEMPTS[key] == 1 and n == 0:
            raise ConnectionError("cut off")
    return len(words)


@workflow
async def streamer(ctx: WorkflowContext, words: list[str]) -> int:
    """Streams from workflow code and an activity (retried), closes one stream and is
    refused a write to it, leaves one open until it ends."""
    await write_stream(ctx, "talk", "hello")
    await write_stream(ctx, "side", 1)
    await close_stream(ctx, "side")
    try:
        await write_stream(ctx, "side", 2)
    except StreamClosedError:
        await write_stream(ctx, "talk", "side closed")
    spoken = await speak(ctx, words)
    await write_stream(ctx, "open", "until the end")
    await wait_timer(ctx, 30)
    return spoken


@activity
async def tally(ctx: WorkflowContext, n: int) -> int:
    return n + 1


@workflow
async def refused_after_a_step(ctx: WorkflowContext) -> int:
    """An activity, then a write to a closed stream from workflow code: the activity's
    record, held back for the write's commit, is kept when the write is refused."""
    await close_stream(ctx, "shut")
    counted = await tally(ctx, 1)
    try:
        await write_stream(ctx, "shut", counted)
    except StreamClosedError:
        counted = await tally(ctx, counted)
    return counted
