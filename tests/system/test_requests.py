"""Requests with a reply through PostgreSQL and a real worker process (issue 29, item 4):
a client's request answered (and refused), the instance ending without a reply raising
at once rather than at the timeout, the timeout itself, the CLI, and a worker killed with
SIGKILL after it took the request and before it replied: the next worker replies exactly
once and the client's retry with the same request id gets that one reply.

Before the feature there was no ``Client.request``, ``message.reply`` or ``kenning
request``: every test here failed."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import time
from pathlib import Path

import psycopg
import pytest

from kenning import (
    Client,
    MessageUndeliverableError,
    RequestNotAnsweredError,
    RequestRejectedError,
    RequestTimeoutError,
    WorkflowNotFoundError,
)
from kenning.db import Database
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, check_invariants, eventually, executions, workers_started
from tests.support import kenning_command as kenning

APP = "tests.apps.requests"
Sql = psycopg.Connection[tuple[object, ...]]


def history(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()


async def test_requests_answered_refused_unanswered_and_timed_out(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    spawn_scheduler(processes, database_url)  # the slow workflow's timer
    await workers_started(processes, [worker])
    rounds = 20
    async with Client(database=database) as client:
        approver = (await client.start("requests.approver", count=rounds + 1)).instance_id
        # the reply wakes the client (NOTIFY), it is not found by the 1 s poll: a round trip
        # (send, the worker's claim, receive, activity, reply, wake) well under a poll interval
        took = []
        for n in range(rounds):
            began = time.monotonic()
            assert await client.request(approver, "approve", {"amount": n}, timeout=10) == {
                "approved": True,
                "amount": n,
            }
            took.append(time.monotonic() - began)
        median = statistics.median(took)
        assert median < 0.5, f"median round trip {median:.3f} s: woken by the poll, not the reply"
        with pytest.raises(RequestRejectedError, match="5000 is over the limit of 1000"):
            await client.request(approver, "approve", {"amount": 5000}, timeout=10)
        assert await client.result(approver, timeout=10) == rounds + 1
        with pytest.raises(MessageUndeliverableError, match="has ended"):
            await client.request(approver, "approve", {"amount": 1}, timeout=10)
        with pytest.raises(WorkflowNotFoundError, match="no workflow instance 'nobody'"):
            await client.request("nobody", "approve", {"amount": 1}, timeout=10)

        # the instance ends without replying: raised when the end commits, not at the timeout
        ignorer = (await client.start("requests.ignorer", wait_for_finish=True)).instance_id
        asking = asyncio.create_task(client.request(ignorer, "approve", {"amount": 1}, timeout=60, request_id="r-i"))
        await eventually(lambda: ("receive:1", "MessageReceived") in history(sql, ignorer), timeout=10)
        assert not asking.done()
        ended = time.monotonic()
        await client.send_message(ignorer, "finish")
        with pytest.raises(RequestNotAnsweredError) as unanswered:
            await asking
        assert time.monotonic() - ended < 5, "raised at the timeout, not when the instance ended"
        assert unanswered.value.status == "completed" and unanswered.value.request_id == "r-i"

        # a request that times out stays in the mailbox; the reply made later is kept
        slow = (await client.start("requests.slow", seconds=1.5)).instance_id
        with pytest.raises(RequestTimeoutError, match=r"got no reply within 0\.3 s"):
            await client.request(slow, "approve", {"amount": 2}, timeout=0.3, request_id="r-s")
    print(f"request round trip through a worker process: median {median * 1000:.1f} ms over {rounds}")

    # the CLI: the reply as JSON; a retry of the timed-out request once the reply is stored
    replied = await asyncio.to_thread(
        kenning, "request", slow, "approve", "--id", "r-s", "--timeout", "30", url=database_url
    )
    assert replied.returncode == 0, replied.stderr
    assert json.loads(replied.stdout) == "late but stored"
    unknown = await asyncio.to_thread(kenning, "request", "nobody", "approve", '{"amount": 1}', url=database_url)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("kenning request: no workflow instance 'nobody' to send request 'approve' (")
    async with Client(database=database) as client:
        waiting = (await client.start("requests.approver")).instance_id
    timed_out = await asyncio.to_thread(
        kenning, "request", waiting, "other-topic", "--timeout", "0.2", url=database_url
    )
    assert timed_out.returncode == 124 and "got no reply within 0.2 s" in timed_out.stderr
    check_invariants(sql)


async def test_a_worker_killed_before_its_reply_the_next_replies_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_BLOCK_FILE": str(block)}
    first = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    await workers_started(processes, [first])
    async with Client(database=database) as client:
        instance = (await client.start("requests.approver")).instance_id
        asking = asyncio.create_task(client.request(instance, "approve", {"amount": 7}, request_id="r-k", timeout=60))
        # taken (recorded) and in the activity before the reply: the worker dies there
        await eventually(lambda: executions(side_channel)[f"check {instance}"] == 1, timeout=30, message="taken")
        assert history(sql, instance) == [("receive:1", "MessageReceived")]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        asking.cancel()  # the client gives up too (its process would have died with the request)
        with pytest.raises(asyncio.CancelledError):
            await asking
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        # the retry sends nothing again (the workflow would wait for it) and gets the one reply
        assert await client.request(instance, "approve", {"amount": 7}, request_id="r-k", timeout=30) == {
            "approved": True,
            "amount": 7,
        }
        assert await client.result(instance, timeout=30) == 1
    assert executions(side_channel)[f"check {instance}"] == 2  # the activity in flight ran again
    assert [kind for _, kind in history(sql, instance)] == ["MessageReceived", "ActivityCompleted", "MessageReplied"]
    assert sql.execute("SELECT message_id FROM kenning_messages WHERE instance_id = %s", (instance,)).fetchall() == [
        ("r-k",)
    ]
    assert sql.execute(
        "SELECT message_id, value FROM kenning_replies WHERE instance_id = %s", (instance,)
    ).fetchall() == [("r-k", {"approved": True, "amount": 7})]
    check_invariants(sql)
