"""Delivery: CloudEvents posted to a real ingress process reach workflows through the
inbox, processed by an in-process worker on real PostgreSQL."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from cloudevents.core.v1.event import CloudEvent

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from kenning_worker.inbox import InboxSettings, add_inbox_arguments, event_start_key, inbox_settings_from_args
from tests.apps import events as apps
from tests.ingress_support import Ingress, batch, binary, cloud_event, start_ingress, structured
from tests.logguard import LogGuard, expect_log
from tests.support import ProcessPool, eventually, executions, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
FAST = InboxSettings(retry_seconds=0.02, max_retry_seconds=0.05, max_attempts=3, cleanup_interval_seconds=3600)


@pytest.fixture
def ingress(database_url: str, processes: ProcessPool) -> Ingress:
    return start_ingress(processes, database_url)


@pytest.fixture
async def http(ingress: Ingress) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=ingress.url, timeout=10) as client:
        yield client


async def post(http: httpx.AsyncClient, event: CloudEvent, mode: str = "binary") -> None:
    headers, body = {"binary": binary, "structured": structured}[mode](event)
    response = await http.post("/", headers=headers, content=body)
    assert response.status_code == 202, response.text


def scalar(sql: Sql, query: str, *params: object) -> Any:
    row = sql.execute(query, params).fetchone()
    return None if row is None else row[0]


def waiting(sql: Sql, instance_id: str) -> bool:
    """Subscribed, and checked for earlier events by the worker."""
    return bool(
        scalar(
            sql,
            "SELECT count(*) FROM kenning_event_subscriptions s JOIN kenning_instances i ON i.id = s.instance_id "
            "WHERE s.instance_id = %s AND s.checked_at IS NOT NULL AND i.status = 'waiting_for_event'",
            instance_id,
        )
    )


def processed(sql: Sql, source: str, event_id: str) -> bool:
    status = scalar(sql, "SELECT status FROM kenning_inbox WHERE source = %s AND event_id = %s", source, event_id)
    return bool(status == "processed")


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "polling"])
async def test_a_posted_event_starts_a_workflow_and_a_second_resumes_it(
    database: Database, sql: Sql, http: httpx.AsyncClient, side_channel: str, listen: bool
) -> None:
    order = cloud_event("order.placed", {"order_id": "o-77", "amount": 30}, source="shop")
    async with (
        running_worker(database, apps.app, listen=listen, poll_interval=0.05),
        Client(database=database) as client,
    ):
        await post(http, order)
        instance_id = await eventually(
            lambda: scalar(
                sql,
                "SELECT id FROM kenning_instances WHERE idempotency_key = %s",
                event_start_key("shop", order.get_id()),
            )
        )
        await eventually(lambda: waiting(sql, instance_id), message="waiting for payment.completed")
        other = cloud_event("payment.completed", {"order_id": "o-78", "amount": 1}, source="payments")
        await post(http, other, "structured")  # another order's payment: not ours
        await eventually(lambda: processed(sql, "payments", other.get_id()))
        assert (await client.status(instance_id)).status == "waiting_for_event"
        payment = cloud_event("payment.completed", {"order_id": "o-77", "amount": 30}, source="payments")
        await post(http, payment, "structured")
        result = await client.result(instance_id, timeout=10)
    assert result == {"order_id": "o-77", "amount": 30, "paid": 30, "payment_source": "payments"}
    rows = sql.execute(
        "SELECT step_id, kind, step_name, payload ->> 'id' FROM kenning_history WHERE instance_id = %s ORDER BY seq",
        (instance_id,),
    ).fetchall()
    assert rows == [
        ("note:1", "ActivityCompleted", "note", None),
        ("wait_event_payment.completed:1", "EventReceived", "wait_event:payment.completed", payment.get_id()),
    ]
    assert executions(side_channel)[f"reserve:o-77 {instance_id}"] == 1
    assert scalar(sql, "SELECT count(*) FROM kenning_inbox WHERE status <> 'processed'") == 0
    assert scalar(sql, "SELECT count(*) FROM kenning_instances") == 1


async def test_json_and_binary_data_survive_the_round_trip(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    blob = bytes(range(256)) * 3
    document = {"text": 'naïve ☃ \\ "q"', "n": [1, 2.5, -3, 10**20], "nested": {"ok": True, "none": None}}
    async with running_worker(database, apps.app), Client(database=database) as client:
        first = (await client.start(apps.waits_blob)).instance_id
        second = (await client.start(apps.waits_blob)).instance_id
        await eventually(lambda: waiting(sql, first) and waiting(sql, second))
        octets = cloud_event(
            "test.blob",
            blob,
            source="blobs",
            datacontenttype="application/octet-stream",
            subject="report.bin",
            kenninginstanceid=first,
        )
        await post(http, octets)
        assert (await client.result(first, timeout=10)) == {
            "id": octets.get_id(),
            "source": "blobs",
            "type": "test.blob",
            "subject": "report.bin",
            "time": binary(octets)[0]["ce-time"],
            "datacontenttype": "application/octet-stream",
            "extensions": {"kenninginstanceid": first},
            "data": blob.hex(),
            "data_kind": "bytes",
        }
        assert (await client.status(second)).status == "waiting_for_event"  # addressed to the first only
        jsonish = cloud_event("test.blob", document, source="blobs", kenninginstanceid=second, traceid="t-1")
        await post(http, jsonish, "structured")
        result = await client.result(second, timeout=10)
    assert result["data"] == document and result["data_kind"] == "dict"
    assert result["extensions"] == {"kenninginstanceid": second, "traceid": "t-1"}


async def test_correlation_routes_each_event_to_its_own_waiter_and_broadcast_reaches_all(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    async with running_worker(database, apps.app), Client(database=database) as client:
        a = (await client.start(apps.waits_for, key="a")).instance_id
        b = (await client.start(apps.waits_for, key="b")).instance_id
        any1 = (await client.start(apps.waits_any)).instance_id
        any2 = (await client.start(apps.waits_any)).instance_id
        await eventually(lambda: all(waiting(sql, i) for i in (a, b, any1, any2)))
        for_b = cloud_event("test.ping", {"key": "b", "extra": 1})
        nobody = cloud_event("test.ping", {"key": "c"})
        for_a = cloud_event("test.ping", {"key": "a"})
        for event in (for_b, nobody, for_a):
            await post(http, event)
        assert (await client.result(b, timeout=10))["id"] == for_b.get_id()
        assert (await client.result(a, timeout=10))["id"] == for_a.get_id()
        shout = cloud_event("test.broadcast", {"hello": "all"})
        await post(http, shout)
        assert (await client.result(any1, timeout=10))["id"] == shout.get_id()
        assert (await client.result(any2, timeout=10))["id"] == shout.get_id()
    assert processed(sql, "tests", nobody.get_id())
    delivered = sql.execute(
        "SELECT instance_id, payload ->> 'id' FROM kenning_history WHERE kind = 'EventReceived' ORDER BY instance_id"
    ).fetchall()
    assert sorted(delivered) == sorted(
        [(a, for_a.get_id()), (b, for_b.get_id()), (any1, shout.get_id()), (any2, shout.get_id())]
    )


async def test_an_event_before_the_subscription_is_taken_only_within_since(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    early = cloud_event("test.ping", {"key": "early"})
    early_too = cloud_event("test.ping", {"key": "late"})
    first = cloud_event("test.ping", {"key": "box"})
    second = cloud_event("test.ping", {"key": "box"})
    async with running_worker(database, apps.app), Client(database=database) as client:
        for event in (early, early_too, first, second):
            await post(http, event)
        await eventually(lambda: all(processed(sql, "tests", e.get_id()) for e in (early, early_too, first, second)))
        with_since = (await client.start(apps.waits_for, key="early", since=60)).instance_id
        without = (await client.start(apps.waits_for, key="late")).instance_id
        mailbox = (await client.start(apps.waits_twice, key="box")).instance_id
        assert (await client.result(with_since, timeout=10))["id"] == early.get_id()
        # two events received before it waited: taken oldest first, each once
        assert await client.result(mailbox, timeout=10) == [first.get_id(), second.get_id()]
        await eventually(lambda: waiting(sql, without), message="checked, found nothing earlier")
        assert (await client.status(without)).status == "waiting_for_event"
        later = cloud_event("test.ping", {"key": "late"})
        await post(http, later)
        assert (await client.result(without, timeout=10))["id"] == later.get_id()


async def test_failing_handlers_retry_with_back_off_then_park_without_blocking_others(
    database: Database, sql: Sql, http: httpx.AsyncClient, side_channel: str, log_guard: LogGuard
) -> None:
    expect_log("inbox.failed", event_type="poison.pill")  # parked on purpose
    poison = cloud_event("poison.pill", {"x": 1})
    flaky = cloud_event("flaky.thing", {"failures": 2})
    behind = [cloud_event("audit.logged", None, subject=f"s{n}", traceparent="00-ab") for n in range(3)]
    with log_guard.capture() as logs:
        async with running_worker(database, apps.app, inbox=FAST):
            for event in (poison, flaky, *behind):
                await post(http, event)

            def parked() -> bool:
                return bool(
                    scalar(sql, "SELECT status FROM kenning_inbox WHERE event_id = %s", poison.get_id()) == "failed"
                )

            await eventually(parked, message="poison parked")
            await eventually(lambda: processed(sql, "tests", flaky.get_id()))
            await eventually(lambda: all(processed(sql, "tests", e.get_id()) for e in behind))
    row = sql.execute(
        "SELECT attempts, last_error, processed_at IS NOT NULL FROM kenning_inbox WHERE event_id = %s",
        (poison.get_id(),),
    ).fetchone()
    assert row == (3, "RuntimeError: cannot digest this event", True)
    assert scalar(sql, "SELECT attempts FROM kenning_inbox WHERE event_id = %s", flaky.get_id()) == 3
    counts = executions(side_channel)
    assert counts[f"poison {poison.get_id()}"] == 3 and counts[f"flaky {flaky.get_id()}"] == 3
    assert all(counts[f"audit {e.get_id()} {e.get_subject()} 00-ab"] == 1 for e in behind)
    names = [entry["event"] for entry in logs if entry.get("event_id") == poison.get_id()]
    assert names.count("inbox.retry") == 2 and names.count("inbox.failed") == 1
    failed = next(e for e in logs if e["event"] == "inbox.failed")
    assert failed["event_type"] == "poison.pill" and failed["attempts"] == 3


async def test_a_row_whose_worker_died_every_time_is_parked(database: Database, sql: Sql) -> None:
    expect_log("inbox.failed", event_id="doomed")
    from kenning.storage import inbox as inbox_sql
    from kenning.storage.inbox import NewEvent

    async with database.transaction() as conn:
        await inbox_sql.inbox_insert_events(conn, [NewEvent("tests", "doomed", "audit.logged", {"specversion": "1.0"})])
    for _ in range(FAST.max_attempts):  # claimed, then the "worker" dies: the lease runs out
        async with database.transaction() as conn:
            (claim,) = await inbox_sql.inbox_claim_pending(conn, limit=1, lease_seconds=0.0)
    assert claim.attempts == FAST.max_attempts
    async with running_worker(database, apps.app, inbox=FAST):
        await eventually(lambda: scalar(sql, "SELECT status FROM kenning_inbox WHERE event_id = 'doomed'") == "failed")
    error = scalar(sql, "SELECT last_error FROM kenning_inbox WHERE event_id = 'doomed'")
    assert "never finished" in error


async def test_handler_session_writes_commit_with_the_row_or_not_at_all(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    expect_log("inbox.failed", event_type="audit.stored")  # the handler that raises
    sql.execute("CREATE TABLE test_audit (event_id text PRIMARY KEY)")
    kept = cloud_event("audit.stored", {"fail": False})
    dropped = cloud_event("audit.stored", {"fail": True})
    async with running_worker(database, apps.app, inbox=FAST):
        await post(http, kept)
        await post(http, dropped)
        await eventually(lambda: processed(sql, "tests", kept.get_id()))
        await eventually(
            lambda: scalar(sql, "SELECT status FROM kenning_inbox WHERE event_id = %s", dropped.get_id()) == "failed"
        )
    assert sql.execute("SELECT event_id FROM test_audit").fetchall() == [(kept.get_id(),)]


async def test_cancel_through_the_ingress_compensates_a_waiting_workflow(
    database: Database, sql: Sql, http: httpx.AsyncClient, side_channel: str
) -> None:
    async with running_worker(database, apps.app), Client(database=database) as client:
        instance_id = (await client.start(apps.reserves_then_waits, key="k1")).instance_id
        await eventually(lambda: waiting(sql, instance_id))
        response = await http.post(f"/cancel/{instance_id}")
        assert response.status_code == 202
        with pytest.raises(WorkflowFailedError, match="cancelled"):
            await client.result(instance_id, timeout=10)
        answer = (await http.get(f"/instances/{instance_id}")).json()
    assert (answer["status"], answer["cancel_requested"]) == ("cancelled", True)
    counts = executions(side_channel)
    assert counts[f"reserve_slot:k1 {instance_id}"] == 1 and counts[f"unreserve:k1 {instance_id}"] == 1
    assert scalar(sql, "SELECT count(*) FROM kenning_event_subscriptions") == 0
    assert scalar(sql, "SELECT status FROM kenning_inbox WHERE kind = 'cancel'") == "processed"


async def test_event_handler_workflows_start_once_per_event_with_validated_input(
    database: Database, sql: Sql, http: httpx.AsyncClient, side_channel: str
) -> None:
    expect_log("inbox.failed", event_type="signup.created")  # the invalid input
    item = cloud_event("bulk.item", {"n": 5}, source="bulk", id="item-5")
    good = cloud_event("signup.created", {"email": "ada@example.org", "plan": "pro"})
    bad = cloud_event("signup.created", {"email": "no plan"})
    async with running_worker(database, apps.app, inbox=FAST), Client(database=database) as client:
        await post(http, item)
        await eventually(lambda: processed(sql, "bulk", "item-5"))
        # the inbox forgot it (retention) and the broker sends it again: no second instance
        sql.execute("DELETE FROM kenning_inbox WHERE event_id = 'item-5'")
        await post(http, item, "structured")
        await eventually(lambda: processed(sql, "bulk", "item-5"))
        instance_id = scalar(sql, "SELECT id FROM kenning_instances WHERE workflow_name = 'bulk.item'")
        assert await client.result(instance_id, timeout=10) == 5
        await post(http, good)
        await post(http, bad)
        started = await eventually(
            lambda: scalar(sql, "SELECT id FROM kenning_instances WHERE workflow_name = 'signup.created'")
        )
        assert await client.result(started, timeout=10) == "ada@example.org:pro"
        await eventually(
            lambda: scalar(sql, "SELECT status FROM kenning_inbox WHERE event_id = %s", bad.get_id()) == "failed"
        )
    assert scalar(sql, "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'bulk.item'") == 1
    assert scalar(sql, "SELECT count(*) FROM kenning_instances WHERE workflow_name = 'signup.created'") == 1
    error = scalar(sql, "SELECT last_error FROM kenning_inbox WHERE event_id = %s", bad.get_id())
    assert "not valid input for workflow 'signup.created'" in error
    assert scalar(sql, "SELECT attempts FROM kenning_inbox WHERE event_id = %s", bad.get_id()) == 1  # not retried


async def test_a_locked_subscription_delays_delivery_without_losing_or_counting_it(
    database: Database, database_url: str, sql: Sql, http: httpx.AsyncClient, log_guard: LogGuard
) -> None:
    async with running_worker(database, apps.app), Client(database=database) as client:
        instance_id = (await client.start(apps.waits_for, key="locked")).instance_id
        await eventually(lambda: waiting(sql, instance_id))
        ping = cloud_event("test.ping", {"key": "locked"})
        with psycopg.connect(database_url) as holder:  # a concurrent timeout or delivery in flight
            holder.execute(
                "SELECT 1 FROM kenning_event_subscriptions WHERE instance_id = %s FOR UPDATE", (instance_id,)
            )
            with log_guard.capture() as logs:
                await post(http, ping)
                await eventually(lambda: any(e["event"] == "inbox.lock_conflict" for e in logs))
            assert not processed(sql, "tests", ping.get_id())
            assert (await client.status(instance_id)).status == "waiting_for_event"
            holder.rollback()
        assert (await client.result(instance_id, timeout=10))["id"] == ping.get_id()
    assert scalar(sql, "SELECT attempts FROM kenning_inbox WHERE event_id = %s", ping.get_id()) == 1


async def test_processed_rows_are_deleted_after_retention_and_parked_ones_kept(
    database: Database, sql: Sql, http: httpx.AsyncClient, log_guard: LogGuard
) -> None:
    log_guard.expect("inbox.failed", event_type="poison.pill")  # parked on purpose: kept past retention
    events = [cloud_event("audit.logged", None, subject="x") for _ in range(3)]
    poison = cloud_event("poison.pill", None)
    settings = InboxSettings(max_attempts=1, retention_seconds=0.2, cleanup_interval_seconds=0.05)
    with log_guard.capture() as logs:
        async with running_worker(database, apps.app, inbox=settings):
            for event in (*events, poison):
                await post(http, event)
            await eventually(lambda: scalar(sql, "SELECT count(*) FROM kenning_inbox") == 1, timeout=10)
    assert sql.execute("SELECT event_id, status FROM kenning_inbox").fetchall() == [(poison.get_id(), "failed")]
    assert sum(e.get("deleted", 0) for e in logs if e["event"] == "inbox.cleaned") == 3


async def test_a_batch_posts_many_events_that_all_reach_their_waiters(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    async with running_worker(database, apps.app), Client(database=database) as client:
        ids = [(await client.start(apps.waits_for, key=f"k{n}")).instance_id for n in range(5)]
        await eventually(lambda: all(waiting(sql, i) for i in ids))
        pings = [cloud_event("test.ping", {"key": f"k{n}"}) for n in range(5)]
        headers, body = batch(pings)
        assert (await http.post("/", headers=headers, content=body)).status_code == 202
        results = [await client.result(i, timeout=10) for i in ids]
    assert [r["id"] for r in results] == [p.get_id() for p in pings]


async def test_a_pending_event_older_than_the_subscription_is_taken_only_with_since(
    database: Database, sql: Sql, http: httpx.AsyncClient
) -> None:
    """The delivery lags: the event is still pending when the workflows subscribe."""
    old = cloud_event("test.ping", {"key": "lag"})
    await post(http, old)
    async with Client(database=database) as client:
        async with running_worker(database, apps.app, inbox=InboxSettings(enabled=False)):
            strict = (await client.start(apps.waits_for, key="lag")).instance_id
            lenient = (await client.start(apps.waits_for, key="lag", since=60)).instance_id
            await eventually(
                lambda: scalar(sql, "SELECT count(*) FROM kenning_event_subscriptions WHERE checked_at IS NULL") == 2
            )
        assert not processed(sql, "tests", old.get_id())
        async with running_worker(database, apps.app):
            assert (await client.result(lenient, timeout=10))["id"] == old.get_id()
            await eventually(lambda: processed(sql, "tests", old.get_id()) and waiting(sql, strict))
            assert (await client.status(strict)).status == "waiting_for_event"


async def test_a_batch_that_fails_together_is_redone_one_event_at_a_time(
    database: Database, sql: Sql, log_guard: LogGuard
) -> None:
    log_guard.expect("inbox.failed", event_id="bad-signup")  # the one bad event of the batch
    from kenning.storage import inbox as inbox_sql
    from kenning.storage.inbox import NewEvent

    attributes = {"specversion": "1.0"}
    rows = [NewEvent("b", f"item-{n}", "bulk.item", attributes, {"n": n}) for n in range(4)]
    rows.insert(2, NewEvent("b", "bad-signup", "signup.created", attributes, {"email": "x"}))
    async with database.transaction() as conn:
        await inbox_sql.inbox_insert_events(conn, rows)
    with log_guard.capture() as logs:
        async with running_worker(database, apps.app, inbox=FAST), Client(database=database) as client:
            await eventually(lambda: scalar(sql, "SELECT count(*) FROM kenning_inbox WHERE status = 'pending'") == 0)
            ids = [str(r[0]) for r in sql.execute("SELECT id FROM kenning_instances ORDER BY id").fetchall()]
            assert sorted([await client.result(i, timeout=10) for i in ids]) == [0, 1, 2, 3]
    assert any(e["event"] == "inbox.batch_retried_alone" and e["rows"] == 5 for e in logs)
    statuses = sql.execute("SELECT event_id, status, attempts FROM kenning_inbox ORDER BY id").fetchall()
    assert statuses == [
        ("item-0", "processed", 1),
        ("item-1", "processed", 1),
        ("bad-signup", "failed", 1),
        ("item-2", "processed", 1),
        ("item-3", "processed", 1),
    ]


def test_inbox_flags_default_to_their_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_INBOX_RETENTION_SECONDS", "600")
    monkeypatch.setenv("KENNING_INBOX", "false")
    parser = argparse.ArgumentParser()
    add_inbox_arguments(parser)
    settings = inbox_settings_from_args(
        parser.parse_args(["--inbox-max-attempts", "3", "--inbox-retry-seconds", "0.5"])
    )
    assert settings == InboxSettings(enabled=False, max_attempts=3, retry_seconds=0.5, retention_seconds=600.0)
    assert inbox_settings_from_args(parser.parse_args(["--inbox"])).enabled is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--inbox-batch-size", "0"])
