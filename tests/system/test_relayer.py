"""The relayer against a real receiver process: attributes and data, retries, dead letters,
the listen and polling modes, retention, configuration errors."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import uuid
from datetime import datetime

import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from kenning.storage import outbox as outbox_sql
from tests.apps import outbox as app
from tests.logguard import LogGuard
from tests.relayer_support import (
    check_outbox_invariants,
    insert_events,
    kenning_cli,
    outbox_row,
    placed_attributes,
    relayer_process,
    running_relayer,
    start_receiver,
    statuses,
)
from tests.support import ProcessPool, eventually, free_port

SQL = psycopg.Connection[tuple[object, ...]]


def created_at(sql: SQL, event_id: str) -> datetime:
    value = outbox_row(sql, event_id)["created_at"]
    assert isinstance(value, datetime)
    return value


@pytest.mark.smoke
async def test_workflow_events_reach_the_broker_as_binary_cloudevents(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, side_channel: str
) -> None:
    receiver = await start_receiver(processes)
    processes.worker(database_url, "tests.apps.outbox", env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    relayer_process(processes, database_url, receiver.url)
    async with Client(database=database) as client:
        started = await client.start(app.outbox_announce, order_id="o-9")
        placed_id, blob_id, note_id = await client.result(started.instance_id, timeout=60)
    await eventually(lambda: statuses(sql) == {"published": 3}, timeout=60, message="3 events published")
    events = {e["attributes"]["id"]: e for e in receiver.events()}
    assert set(events) == {placed_id, blob_id, note_id}
    assert {e["mode"] for e in events.values()} == {"binary"}
    placed = events[placed_id]
    time = datetime.fromisoformat(placed["attributes"].pop("time"))
    assert time == created_at(sql, placed_id)  # the same on every attempt
    assert placed["attributes"] == placed_attributes(placed_id, binary=True)  # extensions as header strings
    assert placed["data"] == {"order_id": "o-9", "total": 42}
    blob = events[blob_id]
    assert blob["content_type"] == "application/octet-stream"
    assert base64.b64decode(blob["data_base64"]) == app.BINARY
    note = events[note_id]
    assert (note["content_type"], note["data"]) == ("text/plain", "thank you")
    check_outbox_invariants(sql)


async def test_structured_mode_with_polling_only(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes)
    relayer_process(
        processes, database_url, receiver.url, "--content-mode", "structured", "--no-listen", "--poll-interval", "0.1"
    )
    ids = [str(uuid.uuid4()) for _ in range(3)]
    async with database.transaction() as conn:
        await outbox_sql.outbox_insert(
            conn,
            event_id=ids[0],
            instance_id="i-1",
            event_type="list.made",
            source="/lists",
            subject="groceries",
            content_type="application/json",
            data_json="[1, 2, 3]",
            extensions={"urgent": True, "priority": 5, "tenant": "acme"},
        )
        await outbox_sql.outbox_insert(
            conn, event_id=ids[1], instance_id="i-2", event_type="blob.made", source="/b", data_bytes=b"\xff\x00"
        )
        await outbox_sql.outbox_insert(
            conn, event_id=ids[2], instance_id=None, event_type="bare", source="/b", content_type=None
        )
    await eventually(lambda: statuses(sql) == {"published": 3}, timeout=60, message="published by polling")
    events = {e["attributes"]["id"]: e for e in receiver.events()}
    assert {e["mode"] for e in events.values()} == {"structured"}
    assert {e["content_type"] for e in events.values()} == {"application/cloudevents+json"}
    made = events[ids[0]]
    made["attributes"].pop("time")
    assert made["attributes"] == {
        "id": ids[0],
        "source": "/lists",
        "type": "list.made",
        "specversion": "1.0",
        "subject": "groceries",
        "datacontenttype": "application/json",
        "urgent": True,  # JSON keeps the extension types
        "priority": 5,
        "tenant": "acme",
    }
    assert made["data"] == [1, 2, 3]
    assert base64.b64decode(events[ids[1]]["data_base64"]) == b"\xff\x00"
    assert events[ids[2]]["data"] is None and "datacontenttype" not in events[ids[2]]["attributes"]
    check_outbox_invariants(sql)


async def test_notify_wakes_an_idle_relayer_long_before_its_poll(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes)
    relayer = relayer_process(processes, database_url, receiver.url, "--poll-interval", "60")
    await eventually(lambda: "relayer.started" in processes.log_of(relayer), timeout=60)
    (event_id,) = await insert_events(database, 1)
    # the relayer polls every 60 s: only the NOTIFY of the insert can wake it this soon
    await eventually(lambda: receiver.accepted()[event_id] == 1, timeout=20, message="delivered on NOTIFY")


async def test_failed_attempts_are_retried_on_the_stored_schedule_across_a_restart(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes, "--fail-first", "2")
    backoff = ("--retry-initial-seconds", "0.4", "--retry-max-seconds", "5")
    first = relayer_process(processes, database_url, receiver.url, *backoff)
    (event_id,) = await insert_events(database, 1)
    await eventually(lambda: outbox_row(sql, event_id)["last_error"] is not None, timeout=60, message="one failure")
    scheduled = outbox_row(sql, event_id)
    assert scheduled["status"] == "pending" and scheduled["attempts"] == 1
    assert "HTTP 500" in str(scheduled["last_error"])
    next_attempt = scheduled["available_at"]
    assert isinstance(next_attempt, datetime) and isinstance(scheduled["last_attempt_at"], datetime)
    assert (next_attempt - scheduled["last_attempt_at"]).total_seconds() >= 0.4  # the back-off, plus jitter
    first.kill()
    first.wait(timeout=10)
    relayer_process(processes, database_url, receiver.url, *backoff)
    await eventually(lambda: outbox_row(sql, event_id)["status"] == "published", timeout=60, message="published")
    arrivals = [e for e in receiver.events() if e["attributes"]["id"] == event_id]
    assert [e["answer"] for e in arrivals] == [500, 500, 200]  # one id, three attempts
    # the restarted relayer kept the stored schedule instead of retrying at once
    assert arrivals[1]["at"] >= next_attempt.timestamp() - 0.01
    published = outbox_row(sql, event_id)
    assert published["attempts"] == 3 and "HTTP 500" in str(published["last_error"])
    check_outbox_invariants(sql)


async def test_exhausted_events_are_dead_lettered_and_do_not_delay_newer_ones(
    database: Database, sql: SQL, processes: ProcessPool, log_guard: LogGuard
) -> None:
    receiver = await start_receiver(processes, "--status-for-type", "poison=503")
    with log_guard.capture() as logs:
        async with running_relayer(database, receiver.url, batch_size=10, max_attempts=2, lease_seconds=1.0):
            poison = await insert_events(database, 20, event_type="poison")
            await eventually(lambda: statuses(sql) == {"failed": 20}, timeout=60, message="20 dead letters")
            assert sum(receiver.arrivals().values()) == 40  # two attempts each
            # Edda 0.1.0 re-picked failed rows first: 10 of them filled every batch for ever.
            fresh = await insert_events(database, 5, event_type="fresh")
            await eventually(
                lambda: statuses(sql) == {"failed": 20, "published": 5}, timeout=10, message="fresh ones published"
            )
    assert sum(receiver.arrivals().values()) == 45  # no dead letter was sent again
    assert all(receiver.accepted()[i] == 1 for i in fresh)
    row = outbox_row(sql, poison[0])
    assert row["attempts"] == 2
    assert str(row["last_error"]).startswith("gave up after 2 attempts; last error: HTTP 503 Service Unavailable")
    dead = [e for e in logs if e["event"] == "outbox.dead_lettered"]
    assert sorted(e["event_id"] for e in dead) == sorted(poison)
    assert len([e for e in logs if e["event"] == "outbox.retry_scheduled"]) == 20
    check_outbox_invariants(sql)


async def test_timeouts_and_connection_errors_are_retried_until_the_broker_answers(
    database: Database, sql: SQL, processes: ProcessPool
) -> None:
    port = free_port()
    broker = f"http://127.0.0.1:{port}/events"
    async with running_relayer(database, broker, request_timeout_seconds=0.3):
        (event_id,) = await insert_events(database, 1)

        def refused_twice() -> bool:
            row = outbox_row(sql, event_id)
            return int(str(row["attempts"])) >= 2 and "ConnectError" in str(row["last_error"])

        await eventually(refused_twice, timeout=60, message="connection errors retried")
        receiver = await start_receiver(processes, "--hang-first", "1", port=port)
        await eventually(lambda: outbox_row(sql, event_id)["status"] == "published", timeout=60)
    assert [e["answer"] for e in receiver.events()] == ["hang", 200]
    assert str(outbox_row(sql, event_id)["last_error"]).startswith("timeout (ReadTimeout)")
    check_outbox_invariants(sql)


async def test_published_events_are_deleted_after_the_retention_period(
    database: Database, sql: SQL, processes: ProcessPool, log_guard: LogGuard
) -> None:
    receiver = await start_receiver(processes)
    with log_guard.capture() as logs:
        async with running_relayer(database, receiver.url, retention_hours=0.0, cleanup_interval_seconds=0.05):
            ids = await insert_events(database, 3)
            await eventually(lambda: sum(receiver.accepted().values()) == 3, timeout=60)
            await eventually(lambda: statuses(sql) == {}, timeout=60, message="published rows deleted")
    assert set(receiver.accepted()) == set(ids)
    assert sum(e["deleted"] for e in logs if e["event"] == "outbox.cleaned") == 3


def test_relayer_and_outbox_commands_report_bad_configuration() -> None:
    url = {"KENNING_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"}
    runs = {
        "no broker URL": (("relayer", "--no-migrate"), url),
        "broker URL must be http://": (("relayer", "--no-migrate", "--broker-url", "ftp://broker/x"), url),
        "KENNING_MAX_ATTEMPTS='0' is invalid": (
            ("relayer", "--broker-url", "http://b/"),
            {**url, "KENNING_MAX_ATTEMPTS": "0"},
        ),
        "name the events to retry": (("outbox", "retry"), url),
        "'not-a-uuid' is not an outbox event id": (("outbox", "retry", "not-a-uuid"), url),
        # a URL that does not parse is named without its password
        "broker URL 'amqp://u:***@host:99999/' is invalid: Port out of range": (
            ("relayer", "--no-migrate", "--broker-url", "amqp://u:secret@host:99999/"),
            url,
        ),
        "broker URL 'amqp://***' is invalid: Invalid IPv6 URL": (
            ("relayer", "--no-migrate", "--broker-url", "amqp://u:secret@[::1/x"),
            url,
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        results = dict(zip(runs, pool.map(lambda run: kenning_cli(*run[0], env=run[1]), runs.values()), strict=True))
    for message, result in results.items():
        assert result.code == 2, (message, result)
        assert message in result.stderr and "Traceback" not in result.stderr, (message, result.stderr)
        assert "secret" not in result.stderr + result.stdout, (message, result.stderr)


async def test_outbox_cli_lists_rejected_events_and_retries_them(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes, "--status-for-type", "order.bad=400")
    relayer_process(processes, database_url, receiver.url)
    bad = await insert_events(database, 2, event_type="order.bad")
    (good,) = await insert_events(database, 1, event_type="order.good")
    await eventually(lambda: statuses(sql) == {"failed": 2, "published": 1}, timeout=60)
    assert receiver.arrivals() == {bad[0]: 1, bad[1]: 1, good: 1}  # a 400 is never retried
    rejected = outbox_row(sql, bad[0])
    assert rejected["attempts"] == 1
    assert str(rejected["last_error"]).startswith("rejected: HTTP 400 Bad Request: refused by test receiver")
    env = {"KENNING_DATABASE_URL": database_url}
    table, as_json = await asyncio.gather(
        asyncio.to_thread(kenning_cli, "outbox", "list", "--status", "failed", env=env),
        asyncio.to_thread(kenning_cli, "outbox", "list", "--status", "failed", "--json", env=env),
    )
    assert table.code == 0 and as_json.code == 0
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["ID", "STATUS", "ATTEMPTS", "TYPE", "INSTANCE", "CREATED", "LAST", "ERROR"]
    assert sorted(line.split()[0] for line in lines) == sorted(bad)
    assert all("failed" in line and "HTTP 400" in line for line in lines)
    listed = json.loads(as_json.stdout)
    assert sorted(e["id"] for e in listed) == sorted(bad)
    assert {(e["status"], e["type"], e["attempts"]) for e in listed} == {("failed", "order.bad", 1)}
    # one by id (a published id is refused with a message), then the rest at once
    mixed = await asyncio.to_thread(kenning_cli, "outbox", "retry", bad[0], good, env=env)
    assert mixed.code == 1 and bad[0] in mixed.stdout
    assert f"event {good} is published, not failed" in mixed.stderr
    await eventually(lambda: receiver.arrivals()[bad[0]] == 2, timeout=60, message="retried event re-sent")
    await eventually(lambda: outbox_row(sql, bad[0])["status"] == "failed", timeout=60)
    everything = await asyncio.to_thread(kenning_cli, "outbox", "retry", "--all-failed", "--json", env=env)
    assert everything.code == 0 and sorted(json.loads(everything.stdout)["retried"]) == sorted(bad)
    await eventually(lambda: receiver.arrivals() == {bad[0]: 3, bad[1]: 2, good: 1}, timeout=60)
    await eventually(lambda: statuses(sql) == {"failed": 2, "published": 1}, timeout=60)
    assert outbox_row(sql, bad[1])["attempts"] == 1  # a retry starts a fresh count
    check_outbox_invariants(sql)
