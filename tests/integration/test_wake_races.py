"""No lost wake-up, at the storage level: the interleavings the designs exist for, forced
with open transactions instead of hoped for under load.

- Messages (kenning.storage.messages): the mailbox's advisory lock, taken in a statement
  of its own before the receive-or-wait or the send, orders a receiver and a sender; the
  second one's statement then sees what the first committed.
- Children (kenning.storage.children, kenning.storage.subscriptions): a child's end is an
  inbox event for its parent; a parent's subscription committed after that event was
  processed is caught by the new subscription's first check (the worker's catch-up).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar, cast

import psycopg
import pytest

from kenning.app import App
from kenning.core.names import CHILD_EVENT_TYPE, EVENT_RECEIVED, MESSAGE_RECEIVED
from kenning.core.records import HistoryRecord, NewInstance, SuspendOutcome
from kenning.db import Database, Executor, statement
from kenning.registry import Registry
from kenning.storage import children as children_sql
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage.messages import SendOutcome, SendStatus
from kenning_worker.inbox import InboxProcessor, InboxSettings
from tests.support import eventually

Sql = psycopg.Connection[tuple[object, ...]]
T = TypeVar("T")

# A blocked statement must be seen blocked, and released, well within these
BLOCKED_WITHIN = 5.0
DONE_WITHIN = 5.0


class Background:
    """Tasks a test starts while it holds a transaction open; any still running at the
    end (the test failed before releasing them) are cancelled, not left to the loop."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self.tasks.append(task)
        return task


@pytest.fixture
async def background() -> AsyncIterator[Background]:
    tasks = Background()
    yield tasks
    for task in tasks.tasks:
        task.cancel()
    await asyncio.gather(*tasks.tasks, return_exceptions=True)


async def _running(database: Database, instance_id: str, workflow: str) -> str:
    """Start ``instance_id`` and claim it as a worker would; its lease token."""
    async with database.connection() as conn:
        await instances_sql.instance_insert(
            conn, instance_id=instance_id, workflow_name=workflow, source_hash="h", input_json={}, idempotency_key=None
        )
    async with database.connection() as conn:
        claim = await claims_sql.instance_claim(
            conn, owner="test-worker", workflow_names=[workflow], limit=1, lease_seconds=60
        )
    (claimed,) = claim.instances
    assert claimed.id == instance_id
    return claimed.lease_token


async def _running_again(database: Database, instance_id: str, workflow: str) -> str:
    """Claim ``instance_id``, runnable again (or started by a step), as a worker would."""
    async with database.connection() as conn:
        (claimed,) = (
            await claims_sql.instance_claim(
                conn, owner="test-worker", workflow_names=[workflow], limit=1, lease_seconds=60
            )
        ).instances
    assert claimed.id == instance_id
    return claimed.lease_token


_BACKEND_PID = statement("SELECT pg_backend_pid() AS pid")


async def _backend_pid(conn: Executor) -> int:
    return int((await conn.execute(_BACKEND_PID)).one().pid)


def _waiting_for_mailbox_lock(sql: Sql, instance_id: str) -> list[tuple[int, list[int]]]:
    """(pid, the pids it waits for) of each backend waiting for ``instance_id``'s mailbox
    lock: a two-int4-key advisory lock is (classid, objid, objsubid 2) in pg_locks."""
    rows = sql.execute(
        """
        SELECT l.pid, pg_blocking_pids(l.pid) FROM pg_locks AS l
        WHERE l.locktype = 'advisory' AND NOT l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = %s AND l.objid = CAST(hashtext(%s) AS oid) AND l.objsubid = 2
        """,
        (messages_sql._MAILBOX_LOCKS, instance_id),
    ).fetchall()
    return [(cast(int, pid), cast(list[int], blockers)) for pid, blockers in rows]


async def _blocked_by(sql: Sql, instance_id: str, holder: int) -> None:
    """Wait until one backend waits for the mailbox lock, and only for ``holder``."""

    def blocked() -> bool:
        waiting = _waiting_for_mailbox_lock(sql, instance_id)
        return len(waiting) == 1 and waiting[0][1] == [holder]

    await eventually(blocked, timeout=BLOCKED_WITHIN, interval=0.01, message=f"a backend waits for {holder}'s lock")


async def _send(database: Database, instance_id: str, topic: str, message_id: str, data: Any) -> SendOutcome:
    """A send as the worker and the client make it: the lock, then the send statement."""
    async with database.transaction() as conn:
        await messages_sql.mailbox_lock(conn, instance_id)
        return await messages_sql.message_send(
            conn, instance_id=instance_id, topic=topic, message_id=message_id, data=data, sender_instance_id=None
        )


async def _receive(
    conn: Executor, instance_id: str, token: str, step_id: str, topic: str
) -> HistoryRecord | SuspendOutcome:
    """A receive as the worker makes it (kenning_worker.port.receive_message), in ``conn``'s
    transaction: the lock, then the receive-or-wait statement."""
    await messages_sql.mailbox_lock(conn, instance_id)
    return await messages_sql.message_receive_or_wait(
        conn,
        instance_id=instance_id,
        token=token,
        step_id=step_id,
        step_name="receive",
        topic=topic,
        timeout_seconds=None,
    )


def _instance(sql: Sql, instance_id: str) -> tuple[object, ...]:
    row = sql.execute(
        "SELECT status, lease_token IS NOT NULL, available_at IS NOT NULL FROM kenning_instances WHERE id = %s",
        (instance_id,),
    ).fetchone()
    assert row is not None
    return row


# ------------------------------------------------------------------ messages


async def test_a_send_while_a_receivers_wait_is_uncommitted_waits_for_it_and_wakes_it(
    database: Database, sql: Sql, background: Background
) -> None:
    """The receiver registered its wait and has not committed; a send meanwhile waits for
    the mailbox lock, then finds the wait: deletes it and makes the receiver runnable, the
    message left in the mailbox for the receiver's next run.

    Without the lock (or with it taken inside the send statement, whose snapshot would
    then predate the receiver's commit) the send would not block, its statement would
    not see the uncommitted wait, and would insert the message and wake nobody: the
    receiver would stay ``waiting_for_message`` beside its message for ever (the
    blocked-send and the final-state assertions below both fail)."""
    token = await _running(database, "r", "receiver")
    async with database.transaction() as receiver:
        holder = await _backend_pid(receiver)
        assert await _receive(receiver, "r", token, "receive:1", "orders") is SuspendOutcome.SUSPENDED
        send = background.start(_send(database, "r", "orders", "m-1", {"n": 1}))
        await _blocked_by(sql, "r", holder)
        assert not send.done()
        # the receiver's suspend is not visible yet: nothing to wake from outside
        assert _instance(sql, "r")[0] == "running"
    sent = await asyncio.wait_for(send, DONE_WITHIN)

    assert (sent.status, sent.woke, sent.recipient_status) == (SendStatus.SENT, True, "waiting_for_message")
    # runnable (pending, due, no lease), its wait gone, the message not taken: the receiver's
    # replay runs receive again and takes it
    assert _instance(sql, "r") == ("pending", False, True)
    assert sql.execute("SELECT count(*) FROM kenning_message_waits WHERE instance_id = 'r'").fetchone() == (0,)
    assert sql.execute(
        "SELECT message_id, data, consumed_step_id FROM kenning_messages WHERE instance_id = 'r'"
    ).fetchall() == [("m-1", {"n": 1}, None)]
    assert sql.execute("SELECT count(*) FROM kenning_history WHERE instance_id = 'r'").fetchone() == (0,)
    # and that next run takes it at once, registering nothing
    token = await _running_again(database, "r", "receiver")
    async with database.transaction() as conn:
        taken = await _receive(conn, "r", token, "receive:1", "orders")
    assert isinstance(taken, HistoryRecord) and taken.payload["message_id"] == "m-1"


async def test_a_receive_while_a_send_is_uncommitted_waits_for_it_and_takes_the_message(
    database: Database, sql: Sql, background: Background
) -> None:
    """The sender inserted its message and has not committed (the recipient is running: no
    wait to find); a receive meanwhile waits for the mailbox lock, then takes the message
    and registers no wait, keeping its lease.

    Without the lock (or with it taken inside the receive statement, whose snapshot would
    predate the sender's commit) the receive would not see the uncommitted message and
    would register its wait, while the send had already looked for a wait and found
    none: a receiver ``waiting_for_message`` beside its message for ever."""
    token = await _running(database, "r", "receiver")
    async with database.transaction() as sender:
        holder = await _backend_pid(sender)
        await messages_sql.mailbox_lock(sender, "r")
        sent = await messages_sql.message_send(
            sender, instance_id="r", topic="orders", message_id="m-1", data={"n": 1}, sender_instance_id="s"
        )
        assert (sent.status, sent.woke, sent.recipient_status) == (SendStatus.SENT, False, "running")

        async def receive() -> HistoryRecord | SuspendOutcome:
            async with database.transaction() as conn:
                return await _receive(conn, "r", token, "receive:1", "orders")

        received = background.start(receive())
        await _blocked_by(sql, "r", holder)
        assert not received.done()
    outcome = await asyncio.wait_for(received, DONE_WITHIN)

    assert isinstance(outcome, HistoryRecord), outcome
    assert (outcome.step_id, outcome.kind) == ("receive:1", MESSAGE_RECEIVED)
    assert (outcome.payload["message_id"], outcome.payload["data"], outcome.payload["sender"]) == ("m-1", {"n": 1}, "s")
    # taken at the receive's step and recorded; no wait; still running under its lease
    assert _instance(sql, "r") == ("running", True, True)
    assert sql.execute("SELECT count(*) FROM kenning_message_waits WHERE instance_id = 'r'").fetchone() == (0,)
    assert sql.execute(
        "SELECT message_id, consumed_step_id FROM kenning_messages WHERE instance_id = 'r'"
    ).fetchall() == [("m-1", "receive:1")]
    assert sql.execute("SELECT step_id, kind FROM kenning_history WHERE instance_id = 'r'").fetchall() == [
        ("receive:1", MESSAGE_RECEIVED)
    ]


# ------------------------------------------------------------------ children

CHILD_STEP = "start_child:child_wf:1"
WAIT_STEP = "start_child:child_wf:1:result"


def _inbox(database: Database) -> InboxProcessor:
    """The worker's inbox loop, driven pass by pass below (an empty registry: no event
    starts a workflow here)."""
    return InboxProcessor(
        database,
        App(registry=Registry()),
        InboxSettings(),
        worker_id="test-worker",
        poll_interval=1.0,
        lease_seconds=30.0,
    )


async def _complete(database: Database, instance_id: str, token: str, result: Any) -> bool:
    async with database.connection() as conn:
        return await instances_sql.instance_complete(conn, instance_id, token, {"result": result})


@pytest.mark.parametrize("inbox_pass", ["before_the_parent_commits", "after_the_parent_commits"])
async def test_a_child_ending_while_its_parents_wait_is_uncommitted_wakes_the_parent(
    inbox_pass: str, database: Database, sql: Sql
) -> None:
    """The parent's wait statement found the child running and subscribed to its end; before
    the parent commits, the child ends (its finishing statement writes the inbox event for
    the parent). The parent is woken with the child's outcome either way the worker's inbox
    pass falls:

    - before the parent commits: the pass processes the event, and its delivery cannot see
      the uncommitted subscription. The subscription's first check (the catch-up, which
      also looks at processed events) delivers it once it is committed. A broken design
      that looked only at pending inbox rows, registered the subscription as checked, or
      left the check out, would leave the parent ``waiting_for_event`` for ever.
    - after: the normal delivery finds the subscription.

    The child's end does not wait for the parent's open transaction either: the finishing
    statement locks no row of the parent (a design that woke the parent by updating its
    row there would block here behind the parent's wait)."""
    parent_token = await _running(database, "p", "parent_wf")
    async with database.connection() as conn:
        started = await children_sql.child_start_and_record(
            conn,
            parent_id="p",
            token=parent_token,
            step_id=CHILD_STEP,
            step_name="start_child",
            child=NewInstance("c", "child_wf", "h", {}),
            on_parent_cancel="cancel",
        )
    assert started is not None and started.recorded
    child_token = await _running_again(database, "c", "child_wf")
    inbox = _inbox(database)

    async with database.transaction() as parent:
        waited = await children_sql.child_wait_or_suspend(
            parent, instance_id="p", token=parent_token, step_id=WAIT_STEP, step_name="child_result", child_id="c"
        )
        assert waited is not None and (waited.cancel_requested, waited.ended) == (False, None)
        assert await asyncio.wait_for(_complete(database, "c", child_token, 9), DONE_WITHIN)
        assert sql.execute(
            "SELECT event_type, instance_id, status FROM kenning_inbox WHERE source = 'kenning.children'"
        ).fetchall() == [(CHILD_EVENT_TYPE, "p", "pending")]
        if inbox_pass == "before_the_parent_commits":
            assert not await inbox._process_batch()
            assert sql.execute("SELECT status FROM kenning_inbox WHERE event_id = 'c'").fetchone() == ("processed",)
            assert not await inbox._catch_up()  # the subscription is not visible yet
            assert sql.execute(
                "SELECT count(*) FROM kenning_history WHERE kind = %s", (EVENT_RECEIVED,)
            ).fetchone() == (0,)

    # committed: the parent waits, subscribed, as far as anyone can see
    assert _instance(sql, "p") == ("waiting_for_event", False, False)
    await inbox._process_batch()
    if inbox_pass == "before_the_parent_commits":
        # the event was processed already: only the subscription's first check can wake it
        assert _instance(sql, "p")[0] == "waiting_for_event"
    await inbox._catch_up()

    assert _instance(sql, "p") == ("pending", False, True)
    ((kind, payload),) = sql.execute(
        "SELECT kind, payload FROM kenning_history WHERE instance_id = 'p' AND step_id = %s", (WAIT_STEP,)
    ).fetchall()
    assert kind == EVENT_RECEIVED
    assert isinstance(payload, dict) and payload["type"] == CHILD_EVENT_TYPE
    assert payload["data"] == {"child_id": "c", "status": "completed", "result": 9, "error": None}
    assert sql.execute("SELECT count(*) FROM kenning_event_subscriptions WHERE instance_id = 'p'").fetchone() == (0,)
