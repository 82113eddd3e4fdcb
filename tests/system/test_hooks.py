"""Hooks fire on every path, each once, and ``on_event_received`` once per delivered event;
``App``'s Edda arguments are read or refused; a failed instance is a warning."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from kenning import Client, WorkflowFailedError
from kenning.db import Database
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from tests.apps import hooks as apps
from tests.logguard import LogGuard, expect_log
from tests.relayer_support import FAST_RELAYER, start_receiver
from tests.support import ProcessPool, eventually, run_kenning, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


ATTRIBUTES = {"specversion": "1.0"}


def go(key: str, n: int, event_id: str | None = None) -> NewEvent:
    return NewEvent("tests", event_id or f"{key}-{n}", "hooks.go", ATTRIBUTES, {"key": key, "n": n})


async def insert(database: Database, *events: NewEvent) -> None:
    async with database.transaction() as conn:
        await inbox_sql.inbox_insert_events(conn, list(events))


def waiting_at(sql: Sql, instance_id: str, n: int) -> bool:
    """Subscribed to round ``n``, and checked for earlier events by the worker."""
    row = sql.execute(
        "SELECT count(*) FROM kenning_event_subscriptions s JOIN kenning_instances i ON i.id = s.instance_id "
        "WHERE s.instance_id = %s AND s.step_id = %s AND s.checked_at IS NOT NULL "
        "AND i.status = 'waiting_for_event'",
        (instance_id, f"wait_event_hooks.go:{n + 1}"),
    ).fetchone()
    return row is not None and row[0] == 1


def everything_processed(sql: Sql) -> bool:
    return sql.execute("SELECT count(*) FROM kenning_inbox WHERE status <> 'processed'").fetchone() == (0,)


async def test_on_event_received_fires_once_per_delivered_event(database: Database, sql: Sql) -> None:
    """Twelve deliveries through each path of the inbox: a batch processed together, rows
    processed alone, and an event taken by a later subscription (``since``)."""
    keys = [f"k{n}" for n in range(4)]
    async with Client(database=database) as client, running_worker(database, apps.app):
        ids = {key: (await client.start(apps.journey, key=key, rounds=3)).instance_id for key in keys}
        for key in keys:
            await eventually(lambda key=key: waiting_at(sql, ids[key], 0), timeout=10)  # type: ignore[misc]
        await insert(database, *(go(key, 0) for key in keys))  # one batch, processed together
        for n in (1, 2):
            for key in keys:
                await eventually(lambda key=key, n=n: waiting_at(sql, ids[key], n), timeout=10)  # type: ignore[misc]
                await insert(database, go(key, n))  # alone
                await insert(database, go(key, n))  # a duplicate: stored once, delivered once
        await insert(database, go("nobody", 0))  # delivered to no one
        await insert(database, go("early", 0))  # taken later, by a subscription with since=
        await eventually(lambda: everything_processed(sql), timeout=10)
        early = (await client.start(apps.journey, key="early", since=60.0)).instance_id
        results = [await client.result(i, timeout=10) for i in [*ids.values(), early]]
    assert results == [3, 3, 3, 3, 1]
    for key, instance_id in ids.items():
        assert apps.hooks.received(instance_id) == [("hooks.go", {"key": key, "n": n}) for n in range(3)]
    assert apps.hooks.received(early) == [("hooks.go", {"key": "early", "n": 0})]
    received = [c for c in apps.hooks.calls if c[0] == "received" and c[1] in {*ids.values(), early}]
    assert len(received) == 13


async def test_every_hook_fires_once_on_the_event_path(database: Database, sql: Sql) -> None:
    """start → activity → wait_event → event → activity (sends an event) → complete."""
    async with Client(database=database) as client, running_worker(database, apps.app):
        instance_id = (await client.start(apps.journey, key="path")).instance_id
        await eventually(lambda: waiting_at(sql, instance_id, 0), timeout=10)
        await insert(database, go("path", 0))
        assert await client.result(instance_id, timeout=10) == 1
    assert apps.hooks.of(instance_id) == Counter(
        {
            "start": 1,
            "activity_start": 2,  # prepare, finish
            "activity_complete": 2,
            "activity_hit": 1,  # prepare, replayed after the event resumed the instance
            "received": 1,
            "sent": 1,
            "complete": 1,
        }
    )


async def test_every_hook_fires_once_on_the_failure_path_and_the_failure_is_a_warning(
    database: Database, sql: Sql, log_guard: LogGuard
) -> None:
    """start → activity (with a compensation) → wait_event → event → failing activity →
    compensation → failed; ``instance.failed`` is logged once, at warning level."""
    expect_log("instance.failed", workflow="hooks.saga")
    with log_guard.capture() as logs:
        async with Client(database=database) as client, running_worker(database, apps.app):
            instance_id = (await client.start(apps.saga, key="doomed")).instance_id
            await eventually(lambda: waiting_at(sql, instance_id, 0), timeout=10)
            await insert(database, go("doomed", 0))
            with pytest.raises(WorkflowFailedError, match="no stock for doomed"):
                await client.result(instance_id, timeout=10)
    assert apps.hooks.of(instance_id) == Counter(
        {
            "start": 1,
            "activity_start": 2,  # reserve, explode
            "activity_complete": 1,
            "activity_hit": 1,
            "activity_failed": 1,
            "received": 1,
            "failed": 1,
        }
    )
    failed = [line for line in logs if line["event"] == "instance.failed" and line.get("instance_id") == instance_id]
    assert [line["level"] for line in failed] == ["warning"]
    executed = [line for line in logs if line["event"] == "compensation.executed"]
    assert [line["level"] for line in executed] == ["info"]


async def test_retry_and_cancel_hooks_fire_once(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client, running_worker(database, apps.app):
        flaky = (await client.start(apps.flaky)).instance_id
        assert await client.result(flaky, timeout=10) == 2
        waiting = (await client.start(apps.journey, key="cancelled")).instance_id
        await eventually(lambda: waiting_at(sql, waiting, 0), timeout=10)
        assert await client.cancel(waiting)
        with pytest.raises(WorkflowFailedError, match="cancelled"):
            await client.result(waiting, timeout=10)
    assert apps.hooks.of(flaky) == Counter(
        {
            "start": 1,
            "activity_start": 2,
            "activity_failed": 1,
            "activity_retry": 1,
            "activity_complete": 1,
            "complete": 1,
        }
    )
    # the cancel replays the body up to wait_event (a cache hit), then compensates
    assert apps.hooks.of(waiting) == Counter(
        {"start": 1, "activity_start": 1, "activity_complete": 1, "activity_hit": 1, "cancelled": 1}
    )


async def test_a_delivery_rolled_back_with_its_batch_reports_nothing(
    database: Database, sql: Sql, log_guard: LogGuard
) -> None:
    """A batch's events are processed in one transaction; when a later event of the batch
    fails, the transaction rolls back, the delivery with it, and every row is redone alone:
    the hook reports the delivery that committed, once."""
    log_guard.expect("inbox.failed", event_id="bad-signup")  # not valid input for hooks.signup
    bad = NewEvent("tests", "bad-signup", "hooks.signup", ATTRIBUTES, {"wrong": 1})
    with log_guard.capture() as logs:
        async with Client(database=database) as client, running_worker(database, apps.app):
            instance_id = (await client.start(apps.journey, key="rollback")).instance_id
            await eventually(lambda: waiting_at(sql, instance_id, 0), timeout=10)
            await insert(database, go("rollback", 0), bad)
            assert await client.result(instance_id, timeout=10) == 1
    assert any(line["event"] == "inbox.batch_retried_alone" and line["rows"] == 2 for line in logs)
    assert apps.hooks.received(instance_id) == [("hooks.go", {"key": "rollback", "n": 0})]


def test_a_process_loading_an_app_with_an_unusable_db_url_says_so_in_one_line() -> None:
    done = run_kenning(
        ["worker", "--app", "tests.apps.hooks:edda_app"],
        {"PATH": "/usr/bin:/bin", "TEST_APP_DATABASE_URL": "sqlite:///edda.db"},
    )
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        "kenning worker: App(db_url=...) must be a postgresql:// URL, got sqlite:// (Kenning runs on PostgreSQL "
        "only): pass a postgresql:// URL, or leave db_url out and set KENNING_DATABASE_URL"
    ]


async def test_processes_fall_back_to_the_apps_db_url_and_broker_url(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    """Worker and scheduler find the database only in the App's db_url; the relayer takes
    its broker from the App's broker_url, and KENNING_DATABASE_URL wins over the App's
    (unreachable) db_url."""
    receiver = await start_receiver(processes)
    app = ("--app", "tests.apps.hooks:edda_app", "--poll-interval", "0.2")
    from_app = {"KENNING_DATABASE_URL": "", "TEST_APP_DATABASE_URL": database_url}
    processes.spawn(["worker", *app], env=from_app, name="worker")
    processes.spawn(["scheduler", *app], env=from_app, name="scheduler")
    relayer_env = {
        "KENNING_DATABASE_URL": database_url,
        "KENNING_BROKER_URL": "",
        "TEST_APP_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/unreachable",
        "TEST_APP_BROKER_URL": receiver.url,
    }
    processes.spawn(["relayer", *app[:2], *FAST_RELAYER], env=relayer_env, name="relayer")
    async with Client(database=database) as client:
        started = await client.start(apps.nap, key="fallback")
        assert await client.result(started.instance_id, timeout=60) == 0  # the timer fired
    await eventually(
        lambda: [e["attributes"]["type"] for e in receiver.events() if "attributes" in e] == ["hooks.finished"],
        timeout=60,
        message="the outbox event reached the App's broker",
    )
