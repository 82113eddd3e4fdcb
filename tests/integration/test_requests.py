"""Requests with a reply (issue 29, item 4) in ``kenning.testing``, on the in-memory and the
PostgreSQL backend alike: the reply, a refusal, a retried request id, the instance ending
without a reply, the timeout and the reply stored after it; and the worker's port: the
reply row and the replying step commit together, or neither does.

Before the feature there was no ``request`` and no ``reply``: every test here failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import psycopg
import pytest
from pydantic import BaseModel

from kenning import (
    Client,
    MessageUndeliverableError,
    RequestNotAnsweredError,
    RequestRejectedError,
    RequestTimeoutError,
    WorkflowNotFoundError,
)
from kenning.core.names import ACTIVITY_FAILED, MESSAGE_RECEIVED, MESSAGE_REPLIED
from kenning.db import Database
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.engine.commands import ReplyMessage
from kenning.engine.history import StepRecord
from kenning.errors import LeaseLostError
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage import replies as replies_sql
from kenning.storage import retention as retention_sql
from kenning.storage import writes as writes_sql
from kenning.testing import WaitsForeverError, WorkflowEnvironment
from kenning_worker.port import PgInstancePort
from tests.apps import requests
from tests.logguard import expect_log
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture(params=["memory", "postgresql"])
async def env(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[WorkflowEnvironment]:
    url = database_url if request.param == "postgresql" else None
    async with WorkflowEnvironment(requests.app, database_url=url, migrate=False) as environment:
        yield environment


async def test_a_request_gets_the_reply_once_and_a_retry_gets_the_same(env: WorkflowEnvironment) -> None:
    handle = await env.start(requests.approver, count=3)
    assert await handle.request("approve", {"amount": 5}, request_id="r-1") == {"approved": True, "amount": 5}
    with pytest.raises(RequestRejectedError) as refused:
        await handle.request("approve", {"amount": 5000}, request_id="r-2")
    assert refused.value.reason == "5000 is over the limit of 1000"
    assert str(refused.value) == (
        f"request 'approve' (r-2) to instance {handle.instance_id} was refused: 5000 is over the limit of 1000"
    )
    # asked again with the same id: not sent twice (the workflow would take it as a third request)
    assert await handle.request("approve", {"amount": 7}, request_id="r-1") == {"approved": True, "amount": 5}
    assert await handle.status() == "waiting_for_message"
    assert await handle.request("approve", {"amount": 9}, request_id="r-3") == {"approved": True, "amount": 9}
    assert await handle.result() == 3
    kinds = [(e.step_id, e.kind) for e in await handle.history() if e.kind in (MESSAGE_RECEIVED, MESSAGE_REPLIED)]
    assert kinds == [
        ("receive:1", MESSAGE_RECEIVED),
        ("reply:1", MESSAGE_REPLIED),
        ("receive:2", MESSAGE_RECEIVED),
        ("reply:2", MESSAGE_REPLIED),
        ("receive:3", MESSAGE_RECEIVED),
        ("reply:3", MESSAGE_REPLIED),
    ]
    # the instance ended: a retry still gets its stored reply, a new request is refused
    assert await handle.request("approve", None, request_id="r-3") == {"approved": True, "amount": 9}
    with pytest.raises(MessageUndeliverableError, match=r"has ended \(completed\): nothing would answer request"):
        await handle.request("approve", {"amount": 1}, request_id="r-4")
    with pytest.raises(WorkflowNotFoundError, match="no workflow instance 'nobody' to send request 'approve'"):
        await env.request("nobody", "approve", {"amount": 1})


async def test_an_instance_that_ends_without_replying_raises_not_answered(env: WorkflowEnvironment) -> None:
    handle = await env.start(requests.ignorer)
    with pytest.raises(RequestNotAnsweredError) as unanswered:
        await handle.request("approve", {"amount": 5}, request_id="r-9", timeout=3600)
    assert unanswered.value.status == "completed"
    assert (unanswered.value.instance_id, unanswered.value.topic, unanswered.value.request_id) == (
        handle.instance_id,
        "approve",
        "r-9",
    )
    assert "was not answered: the instance ended completed" in str(unanswered.value)


async def test_a_request_times_out_and_the_later_reply_is_kept(env: WorkflowEnvironment) -> None:
    handle = await env.start(requests.slow, seconds=3600)
    with pytest.raises(RequestTimeoutError, match=r"got no reply within 60\.0 s"):
        await handle.request("approve", {"amount": 5}, request_id="r-5", timeout=60)
    assert await handle.status() == "waiting_for_timer"  # it took the request; its reply comes later
    await env.sleep(3600)
    assert await handle.result() == {"amount": 5}
    assert await handle.request("approve", None, request_id="r-5") == "late but stored"


async def test_a_second_reply_is_the_workflows_recorded_error(env: WorkflowEnvironment) -> None:
    expect_log("instance.failed")
    handle = await env.start(requests.twice)
    assert await handle.request("approve", None, request_id="r-6") == "first"
    state = await handle.state()
    assert state.status == "failed"
    assert state.error is not None and state.error["type"] == "kenning.errors.MessageAlreadyRepliedError"
    replies = [(e.step_id, e.kind) for e in state.history][1:]
    assert replies == [("reply:1", MESSAGE_REPLIED), ("reply:2", ACTIVITY_FAILED)]


async def test_the_reply_and_its_step_commit_together_or_not_at_all(database: Database, sql: Sql) -> None:
    async def apply(writes: Sequence[writes_sql.InstanceWrite]) -> list[bool | None]:
        async with database.connection() as conn:
            return await writes_sql.writes_apply(conn, writes)

    async with database.transaction() as conn:
        await instances_sql.instance_insert(
            conn, instance_id="i", workflow_name="wf", source_hash="h", input_json={}, idempotency_key=None
        )
        for message_id in ("m-1", "m-2"):
            await messages_sql.mailbox_lock(conn, "i")
            await messages_sql.message_send(
                conn, instance_id="i", topic="ask", message_id=message_id, data=None, sender_instance_id=None
            )
        (claimed,) = (
            await claims_sql.instance_claim(conn, owner="a", workflow_names=["wf"], limit=1, lease_seconds=30)
        ).instances
    port = PgInstancePort(
        database=database, claimed=claimed, writes=GroupCommit(write=apply, retry_alone=may_be_one_callers_fault)
    )

    def reply(step_id: str, message_id: str, value: object) -> ReplyMessage:
        record = StepRecord(step_id, MESSAGE_REPLIED, "reply:ask", {"message_id": message_id})
        return ReplyMessage(record, message_id, value, None)

    assert await port.reply_message(reply("reply:1", "m-1", {"ok": 1})) is True
    # a second reply to the same message: refused, nothing written
    assert await port.reply_message(reply("reply:2", "m-1", {"ok": 2})) is False
    history = sql.execute("SELECT step_id, kind FROM kenning_history WHERE instance_id = 'i' ORDER BY seq").fetchall()
    assert history == [("reply:1", MESSAGE_REPLIED)]
    async with database.connection() as conn:
        state = await replies_sql.request_state(conn, instance_id="i", message_id="m-1")
    assert state == replies_sql.RequestState(status="running", replied=True, value={"ok": 1}, error=None)

    # the lease moved: the record's fence fails, and the reply rolls back with it
    sql.execute("UPDATE kenning_instances SET lease_token = gen_random_uuid() WHERE id = 'i'")
    with pytest.raises(LeaseLostError):
        await port.reply_message(reply("reply:3", "m-2", "lost"))
    assert sql.execute("SELECT message_id FROM kenning_replies ORDER BY message_id").fetchall() == [("m-1",)]
    assert sql.execute("SELECT count(*) FROM kenning_history WHERE instance_id = 'i'").fetchone() == (1,)


async def test_a_request_nobody_takes_waits_forever_without_a_timeout(env: WorkflowEnvironment) -> None:
    handle = await env.start(requests.approver)
    with pytest.raises(WaitsForeverError, match=r"request 'other' \(r-7\) .* has not replied, and nothing is due"):
        await handle.request("other", None, request_id="r-7")
    with pytest.raises(RequestTimeoutError, match="the request stays in its mailbox"):
        await handle.request("other", None, request_id="r-7", timeout=timedelta(minutes=5))

    class Approval(BaseModel):
        approved: bool
        amount: int

    reply = await handle.request("approve", {"amount": 3}, model=Approval)
    assert reply == Approval(approved=True, amount=3)


async def test_retention_deletes_an_instances_replies_with_it(database: Database, sql: Sql) -> None:
    sql.execute("INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source) VALUES ('wf', 'h', '')")
    for instance_id in ("old", "new"):
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, source_hash, input, status, finished_at)"
            " VALUES (%s, 'wf', 'h', '{}', 'completed', now() - make_interval(days => %s))",
            (instance_id, 10 if instance_id == "old" else 0),
        )
        sql.execute("INSERT INTO kenning_replies (instance_id, message_id, value) VALUES (%s, 'm', '1')", [instance_id])
    async with database.connection() as conn:
        assert (await retention_sql.instances_expired_count(conn, default_seconds=86400)).waits == 1
        expired = await retention_sql.instances_expire(conn, default_seconds=86400, limit=10)
    assert (expired.instances, expired.waits) == (1, 1)
    assert sql.execute("SELECT instance_id FROM kenning_replies").fetchall() == [("new",)]


async def test_a_request_to_an_instance_cancelled_meanwhile_raises_at_the_cancel(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client, running_worker(database, requests.app):
        instance = (await client.start("requests.ignorer", wait_for_finish=True)).instance_id
        asking = asyncio.create_task(client.request(instance, "approve", {"amount": 1}, timeout=60, request_id="r-c"))

        def taken() -> bool:
            row = sql.execute(
                "SELECT count(*) FROM kenning_history WHERE instance_id = %s AND step_id = 'receive:1'", [instance]
            ).fetchone()
            return row == (1,)

        await eventually(taken, timeout=10, message="the request taken")
        cancelled_at = time.monotonic()
        assert await client.cancel(instance)
        with pytest.raises(RequestNotAnsweredError, match="the instance ended cancelled") as unanswered:
            await asking
        assert time.monotonic() - cancelled_at < 5  # the end's commit woke it, not the 60 s timeout
    assert unanswered.value.status == "cancelled"


async def test_a_request_cancelled_as_a_notification_wakes_it_is_cancelled(database: Database) -> None:
    """The client's wait is cancelled in the loop turn a notification wakes it: the
    cancellation must reach the caller (Python 3.11's ``asyncio.wait_for`` returned
    normally then, and the request waited out its whole timeout)."""
    async with Client(database=database) as client:
        instance = (await client.start(requests.approver, count=1)).instance_id  # no worker: it stays pending
        asking = asyncio.create_task(client.request(instance, "approve", {"amount": 1}, timeout=5))
        while not client.results._waiters.get(instance):  # the request waits for its reply now
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # past its first read, in the wait between reads (a 1 s poll)
        for woken in client.results._waiters[instance]:
            woken.set()  # a notification, in the same turn as the cancel
        asking.cancel()
        began = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert time.monotonic() - began < 2
