"""Messages through PostgreSQL and real processes: a mailbox filled before its receiver
waits, a worker killed between two receives, workflow-to-workflow ping-pong, a receive's
timeout fired by the scheduler, client and CLI sends (unknown instance, ended instance,
a resent id), and the stuck check repairing a receiver left waiting beside its message."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import psycopg
import pytest

from kenning import Client, MessageUndeliverableError, WorkflowNotFoundError
from kenning.commands import why
from kenning.db import Database
from kenning.storage import messages as messages_sql
from kenning.storage import progress as progress_sql
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, check_invariants, eventually, executions
from tests.support import kenning_command as kenning

APP = "tests.apps.messages"
Sql = psycopg.Connection[tuple[object, ...]]


def history_kinds(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()


async def test_mailboxes_through_real_workers_and_a_scheduler(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    """A mailbox filled before its receiver ever runs is taken in order; two workflows
    play ping-pong across two workers; a receive times out through the scheduler and the
    message that comes later is kept for the next receive; the CLI sends, and refuses an
    unknown instance in one line. One set of processes for all of it."""
    async with Client(database=database) as client:
        collector = (await client.start("collect", count=4)).instance_id
        for n in range(3):  # no worker yet: the mailbox fills before the workflow runs
            await client.send_message(collector, "items", n)
        sent, unknown = await asyncio.gather(
            asyncio.to_thread(kenning, "message", "send", collector, "items", "--data", '{"n": 3}', url=database_url),
            asyncio.to_thread(kenning, "message", "send", "nobody", "items", "--data", "1", url=database_url),
        )
        assert sent.returncode == 0, sent.stderr
        assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
        assert unknown.stderr.strip() == "kenning message: no workflow instance 'nobody' to send message 'items' to"

        env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
        for _ in range(2):
            processes.worker(database_url, APP, env=env)
        spawn_scheduler(processes, database_url)
        patient = (await client.start("patient_receiver", timeout=0.3)).instance_id
        pong = (await client.start("ponger", rounds=5)).instance_id
        ping = (await client.start("pinger", peer=pong, rounds=5)).instance_id
        listeners = [(await client.start("listener", channel="news", count=2)).instance_id for _ in range(2)]

        assert await client.result(collector, timeout=30) == [0, 1, 2, {"n": 3}]
        assert await client.result(ping, timeout=30) == [f"{n} from {pong}" for n in range(5)]
        assert await client.result(pong, timeout=10) == list(range(5))

        def second_receive_waits() -> bool:
            row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (patient,)).fetchone()
            return ("receive:1", "MessageTimeout") in history_kinds(sql, patient) and row == ("waiting_for_message",)

        await eventually(second_receive_waits, timeout=30, message="timed out, then waiting again")
        await client.send_message(patient, "answer", "late")
        assert await client.result(patient, timeout=30) == ["timed out", "late"]

        # broadcast: each subscriber gets its own copy, a client's publish and a workflow's
        def subscribed() -> bool:
            row = sql.execute("SELECT count(*) FROM kenning_channel_subscriptions WHERE channel = 'news'").fetchone()
            return row == (2,)

        await eventually(subscribed, timeout=30, message="both listeners subscribed")
        assert await client.publish("news", "first") == 2
        caster = (await client.start("broadcaster", channel="news", items=["second"])).instance_id
        assert await client.result(caster, timeout=30) == [2]
        for listener in listeners:
            assert await client.result(listener, timeout=30) == ["first", "second"]

    async with database.connection() as conn:
        mailbox = await messages_sql.messages_of(conn, collector)
    assert [m.consumed_step_id for m in mailbox] == ["receive:1", "receive:2", "receive:3", "receive:4"]
    assert mailbox[3].message_id == sent.stdout.strip() and mailbox[3].sender_instance_id is None
    assert [kind for _, kind in history_kinds(sql, ping)] == ["MessageSent", "MessageReceived"] * 5
    timed = sql.execute(
        "SELECT payload FROM kenning_history WHERE instance_id = %s AND step_id = 'receive:1'", (patient,)
    ).fetchone()
    assert timed is not None and isinstance(timed[0], dict) and timed[0]["fired_at"] >= timed[0]["timeout_at"]
    check_invariants(sql)


async def test_a_worker_killed_between_receives_loses_no_message_and_takes_each_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {
        "KENNING_TEST_SIDE_CHANNEL": side_channel,
        "KENNING_TEST_BLOCK_FILE": str(block),
        "KENNING_TEST_BLOCK_AT": "5",
    }
    first = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    async with Client(database=database) as client:
        started = await client.start("collect", count=12)
        instance = started.instance_id
        for n in range(8):
            await client.send_message(instance, "items", n)
        # blocked in the activity after the 6th receive: five taken and handled, more queued
        await eventually(lambda: executions(side_channel)[f"msg {instance} 5"] == 1, timeout=30, message="6th taken")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        # nothing is listening now: these wait in the mailbox for whoever takes over
        for n in range(8, 12):
            await client.send_message(instance, "items", n)
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        assert await client.result(instance, timeout=30) == list(range(12))
    counts = executions(side_channel)
    # the activity in flight at the kill ran again (at-least-once); every other once, and
    # every message was taken by one receive, once: the crash re-took none and lost none
    assert {n: counts[f"msg {instance} {n}"] for n in range(12)} == {n: 2 if n == 5 else 1 for n in range(12)}
    taken = sql.execute(
        "SELECT data, consumed_step_id FROM kenning_messages WHERE instance_id = %s ORDER BY seq", (instance,)
    ).fetchall()
    assert taken == [(n, f"receive:{n + 1}") for n in range(12)]
    check_invariants(sql)


async def test_client_sends_refuse_clearly_and_a_resent_id_is_sent_once(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client:
        with pytest.raises(WorkflowNotFoundError, match="no workflow instance 'nobody'"):
            await client.send_message("nobody", "items", 1)
        started = await client.start("collect", count=1)
        first = await client.send_message(started.instance_id, "items", "once", message_id="m-1")
        again = await client.send_message(started.instance_id, "items", "twice?", message_id="m-1")
        assert first == again == "m-1"
        sql.execute(
            "UPDATE kenning_instances SET status = 'completed', finished_at = now(), available_at = NULL WHERE id = %s",
            (started.instance_id,),
        )
        with pytest.raises(MessageUndeliverableError, match=r"has ended \(completed\)"):
            await client.send_message(started.instance_id, "items", "too late")
    rows = sql.execute("SELECT message_id, data FROM kenning_messages").fetchall()
    assert rows == [("m-1", "once")]


async def test_the_stuck_check_wakes_a_receiver_left_waiting_beside_its_message(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client:
        started = await client.start("collect", count=1)
    instance = started.instance_id
    sql.execute(
        "INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source) VALUES ('collect', 'h', '')"
    )
    # what the mailbox's lock never lets commit: waiting, with a message for it already there
    sql.execute(
        "UPDATE kenning_instances SET status = 'waiting_for_message', available_at = NULL WHERE id = %s", (instance,)
    )
    sql.execute(
        "INSERT INTO kenning_message_waits (instance_id, step_id, step_name, topic) "
        "VALUES (%s, 'receive:1', 'receive:items', 'items')",
        (instance,),
    )
    sql.execute(
        "INSERT INTO kenning_messages (instance_id, topic, message_id, data) VALUES (%s, 'items', 'x', '1')",
        (instance,),
    )
    with pytest.raises(AssertionError, match="mailbox holds a message"):
        check_invariants(sql)
    async with database.connection() as conn:
        info = await progress_sql.instance_explain(conn, instance)
    assert info is not None
    assert why.way_forward(info) == "a message on topic 'items' (a send wakes it); no time-out"
    info["way_forward"] = why.way_forward(info)
    assert ("mailbox", "1 message(s) not received yet") in why.lines(info)
    async with database.connection() as conn:
        found = await progress_sql.stuck_repair(conn, limit=10, max_repairs=3)
    assert [(s.instance_id, s.missing, s.cause) for s in found] == [
        (instance, "waiting_for_message with a message for it in its mailbox", None)
    ]
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
    assert row == ("pending",)
    assert sql.execute("SELECT count(*) FROM kenning_message_waits").fetchone() == (0,)
    # and one waiting with no wait at all
    sql.execute(
        "UPDATE kenning_instances SET status = 'waiting_for_message', available_at = NULL WHERE id = %s", (instance,)
    )
    async with database.connection() as conn:
        found = await progress_sql.stuck_repair(conn, limit=10, max_repairs=3)
    assert [s.missing for s in found] == ["waiting_for_message without a receive wait"]
