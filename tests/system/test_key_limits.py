"""Per-key strategies and per-key rate limits of a queue (issue 35, items 3 and 4),
through real worker processes racing for the same keys: a singleton key's second start
returns the running instance; ``cancel_newest`` ends a start over the key's limit at once
and tells its caller; ``cancel_in_progress`` cancels the key's oldest instance (its
compensation runs) and runs the new one; a rate-limited key never exceeds its starts per
period while a quiet key is not held up behind it."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import prometheus_client
import psutil
import psycopg
import pytest

import tests.apps.key_limits as app
from kenning import Client, ConfigurationError, Queue, RateLimit, WorkflowFailedError
from kenning.db import Database
from tests.console_support import console_ready, spawn_console
from tests.invariants import key_rate
from tests.support import ProcessPool, check_invariants, eventually, kenning_command, workers_started

APP = "tests.apps.key_limits"
Sql = psycopg.Connection[tuple[object, ...]]


def _workers(processes: ProcessPool, database_url: str, side_channel: str, count: int) -> list[psutil.Popen]:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    return [
        processes.worker(database_url, APP, "--lease-seconds", "2", "--concurrency", "8", env=env) for _ in range(count)
    ]


def _status(sql: Sql, instance_id: str) -> str:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return "" if row is None else str(row[0])


def _recorded(side_channel: str) -> list[str]:
    with open(side_channel) as fh:
        return fh.read().splitlines()


async def test_a_singleton_keys_second_start_returns_the_running_instance(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await workers_started(processes, _workers(processes, database_url, side_channel, 2))
    async with Client(database=database) as client:
        # concurrent starts of one key, group-committed together and apart: one instance
        joined_before = _strategy_count("test-singleton", "singleton")
        started = await asyncio.gather(*(client.start(app.singleton_job, n=n, partition_key="a") for n in range(12)))
        other = await client.start(app.singleton_job, n=99, partition_key="b")
        ids = {s.instance_id for s in started}
        assert len(ids) == 1, started
        assert [s.created for s in started].count(True) == 1
        assert _strategy_count("test-singleton", "singleton") - joined_before == 11
        (running,) = ids
        assert other.created and other.instance_id != running
        await eventually(lambda: _status(sql, running) == "waiting_for_message", 30, message="the singleton waiting")
        again = await client.start(app.singleton_job, n=100, partition_key="a")
        assert (again.instance_id, again.created) == (running, False)
        await client.send_message(running, "go")
        assert await asyncio.wait_for(client.result(running), 30) in range(12)
        # once it ended the key is free: the next start makes a new instance
        after = await client.start(app.singleton_job, n=101, partition_key="a")
        assert after.created and after.instance_id != running
        for instance_id in (after.instance_id, other.instance_id):
            await eventually(lambda i=instance_id: _status(sql, i) == "waiting_for_message", 30)  # type: ignore[misc]
            await client.send_message(instance_id, "go")
        assert await asyncio.wait_for(client.result(after.instance_id), 30) == 101
    check_invariants(sql)


async def test_concurrent_starters_of_one_key_are_decided_one_after_another(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    """Starts of one key from several clients (each its own transaction, not one group
    commit): the key's lock orders them, so each counts what the one before committed."""
    await workers_started(processes, _workers(processes, database_url, side_channel, 2))
    clients = [Client(database_url) for _ in range(4)]
    try:
        singles = await asyncio.gather(
            *(c.start(app.singleton_job, n=n, partition_key="s") for n, c in enumerate(clients * 3))
        )
        newest = await asyncio.gather(
            *(c.start(app.newest_job, n=n, partition_key="n") for n, c in enumerate(clients * 3))
        )
    finally:
        for c in clients:
            await c.close()
    assert len({s.instance_id for s in singles}) == 1 and [s.created for s in singles].count(True) == 1
    assert [s.cancelled for s in newest].count(False) == 2  # partition_concurrency=2
    opened = sql.execute(
        "SELECT partition_key, count(*) FROM kenning_instances WHERE partition_key IN ('s', 'n') "
        "AND status <> 'cancelled' GROUP BY partition_key ORDER BY partition_key"
    ).fetchall()
    assert opened == [("n", 2), ("s", 1)]
    async with Client(database=database) as client:
        for instance_id in [singles[0].instance_id, *(s.instance_id for s in newest if not s.cancelled)]:
            await eventually(lambda i=instance_id: _status(sql, i) == "waiting_for_message", 30)  # type: ignore[misc]
            await client.send_message(instance_id, "go")
            await client.result(instance_id, timeout=30)


async def test_cancel_newest_ends_a_start_over_the_keys_limit_and_tells_its_caller(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await workers_started(processes, _workers(processes, database_url, side_channel, 2))
    async with Client(database=database) as client:
        refused_before = _strategy_count("test-cancel-newest", "cancel_newest")
        started = await asyncio.gather(*(client.start(app.newest_job, n=n, partition_key="k") for n in range(8)))
        quiet = await client.start(app.newest_job, n=50, partition_key="q")
        kept = [s for s in started if not s.cancelled]
        refused = [s for s in started if s.cancelled]
        assert len(kept) == 2 and len(refused) == 6, started  # partition_concurrency=2
        assert all(s.created for s in started) and not quiet.cancelled
        assert _strategy_count("test-cancel-newest", "cancel_newest") - refused_before == 6
        for s in refused:  # ended at once, said so to whoever awaits it
            assert (await client.status(s.instance_id)).status == "cancelled"
            with pytest.raises(WorkflowFailedError) as failed:
                await client.result(s.instance_id, timeout=10)
            assert failed.value.status == "cancelled" and "cancel_newest" in str(failed.value.error)
        for s in [*kept, quiet]:
            await eventually(lambda i=s.instance_id: _status(sql, i) == "waiting_for_message", 30)  # type: ignore[misc]
            await client.send_message(s.instance_id, "go")
        assert sorted(await asyncio.gather(*(client.result(s.instance_id, timeout=30) for s in kept))) == sorted(
            started.index(s) for s in kept
        )
    seated = {line.split()[1] for line in _recorded(side_channel) if line.startswith("take_seat")}
    assert seated == {s.instance_id for s in [*kept, quiet]}  # a refused start never ran
    check_invariants(sql)


async def test_cancel_in_progress_compensates_the_oldest_and_runs_the_new_one(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await workers_started(processes, _workers(processes, database_url, side_channel, 2))
    async with Client(database=database) as client:
        old = (await client.start(app.in_progress_job, n=1, partition_key="k")).instance_id
        await eventually(lambda: _status(sql, old) == "waiting_for_message", 30, message="the old one waiting")
        new = await client.start(app.in_progress_job, n=2, partition_key="k")
        assert new.created and not new.cancelled
        with pytest.raises(WorkflowFailedError) as failed:
            await client.result(old, timeout=30)
        assert failed.value.status == "cancelled"
        await eventually(lambda: _status(sql, new.instance_id) == "waiting_for_message", 30, message="the new one")
        await client.send_message(new.instance_id, "go")
        assert await client.result(new.instance_id, timeout=30) == 2
    lines = _recorded(side_channel)
    assert f"free_seat {old}" in lines and f"free_seat {new.instance_id}" not in lines
    # the old one's compensation ran before the new one took its seat? not required: it ran
    assert lines.index(f"take_seat {old}") < lines.index(f"free_seat {old}")
    check_invariants(sql)


async def test_a_rate_limited_key_never_exceeds_its_limit_and_a_quiet_key_is_not_held_up(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await workers_started(processes, _workers(processes, database_url, side_channel, 3))
    async with Client(database=database) as client:
        busy = await asyncio.gather(*(client.start(app.customer_job, customer="busy", n=n) for n in range(15)))
        quiet = await client.start(app.customer_job, customer="quiet", n=-1)
        assert await asyncio.wait_for(client.result(quiet), 30) == -1
        results = await asyncio.wait_for(asyncio.gather(*(client.result(s) for s in busy)), 60)
    assert results == list(range(15))  # every busy start waited durably and ran: none failed
    # RateLimit(limit=3, period=2.0, key="customer"): the input field is the partition key
    assert key_rate(sql, "test-per-customer", 3, 2.0) == {"busy": 3, "quiet": 1}
    # the quiet key's start ran before the busy key's backlog drained: it did not queue
    # behind the busy key's later windows (an order, not a time)
    row = sql.execute(
        "SELECT count(*) FROM kenning_instances AS b, kenning_instances AS q "
        "WHERE q.id = %s AND b.partition_key = 'busy' AND b.started_at > q.started_at",
        (quiet.instance_id,),
    ).fetchone()
    assert row is not None and int(str(row[0])) >= 4, row
    check_invariants(sql)


def _strategy_count(queue: str, strategy: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "kenning_queue_strategy_starts_total", {"queue": queue, "strategy": strategy}
    )
    return value or 0.0


async def test_why_says_a_held_back_start_waits_for_its_keys_rate_window_and_until_when(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    await workers_started(processes, _workers(processes, database_url, side_channel, 1))
    async with Client(database=database) as client:
        first = await client.start(app.hourly_job, account="acme", n=1)
        held = await client.start(app.hourly_job, account="acme", n=2)
        assert await client.result(first, timeout=30) == 1
    # RateLimit(limit=1, period=3600): the second waits, durably, for the first to leave the window
    await eventually(lambda: _status(sql, held.instance_id) == "pending" and _due_later(sql, held.instance_id), 30)
    out = kenning_command("why", held.instance_id, "--json", url=database_url)
    assert out.returncode == 0, out
    why = json.loads(out.stdout)
    assert why["queue"]["partition_key"] == "acme" and why["queue"]["waits_for"] == "key_rate"
    assert (why["queue"]["key_started"], why["queue"]["key_rate_limit"]) == (1, 1) and why["queue"]["until"]
    assert re.search(r"when key 'acme''s rate window frees: \S+ \(in (59|60)m\)", why["way_forward"]), why
    text = kenning_command("why", held.instance_id, url=database_url)
    assert text.returncode == 0 and "test-hourly, key 'acme'; 1 of 1 starts in the last 60m" in text.stdout, text


def _due_later(sql: Sql, instance_id: str) -> bool:
    row = sql.execute(
        "SELECT available_at > now() + interval '1 minute' FROM kenning_instances WHERE id = %s", (instance_id,)
    ).fetchone()
    return bool(row and row[0])


def test_declarations_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="partition_strategy"):
        Queue("test-bad-strategy", partition_strategy="first")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="singleton"):
        Queue("test-bad-singleton", partition_strategy="singleton", partition_concurrency=2)
    with pytest.raises(ConfigurationError, match="limit"):
        RateLimit(limit=0, period=1)
    with pytest.raises(ConfigurationError, match="period"):
        RateLimit(limit=1, period=float("inf"))


async def test_the_console_and_queues_list_name_the_keys_held_by_their_rate_limit_and_until_when(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    sql.execute(
        "INSERT INTO kenning_queues (name, partition_strategy, key_rate_limit, key_rate_period_seconds) "
        "VALUES ('mail', 'cancel_newest', 5, 60)"
    )
    # what a claim leaves behind for a full key: never started, not due until its window frees
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, source_hash, input, available_at, queue_name, "
        "partition_key) SELECT 'held-' || g, 'mailer', '', '{}', now() + interval '42 seconds', 'mail', 'acme' "
        "FROM generate_series(1, 3) AS g"
    )
    url, console = spawn_console(processes, database_url)
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        page = await client.get("/queues")
    assert page.status_code == 200
    assert 'data-rate-held="3"' in page.text and "acme</span> 3 until" in page.text, page.text
    assert "per key rate 5 / 60 s" in page.text and "over it: cancel_newest" in page.text
    listed = kenning_command("queues", "list", "--json", url=database_url)
    assert listed.returncode == 0, listed
    (mail,) = json.loads(listed.stdout)
    assert (mail["rate_held"], mail["rate_held_keys"][0][:2]) == (3, ["acme", 3])
    assert "strategy=cancel_newest key_rate=5/60s" in kenning_command("queues", "list", url=database_url).stdout
