"""Published values and search attributes on PostgreSQL (issue 29, item 3): the value and
its step commit together and the latest wins; ``Client.get_value`` reads without a worker
and, with a timeout, is woken by the publishing step's NOTIFY (the client's fallback poll
is set to 30 s here, so only the notification can wake it in time); ``Client.list(where=)``
finds instances by their declared attributes through the lookup index, newest first,
every pair ANDed; retention deletes the values with the instance.

Before the feature none of ``publish_value``, ``get_value``, ``list(where=)`` existed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import psycopg
import pytest

from kenning import Client, PublishedStatus, ValueNotPublishedError, WorkflowNotFoundError
from kenning.client import InvalidInputError
from kenning.db import Database
from kenning.storage import published as published_sql
from kenning.storage import retention as retention_sql
from kenning.testing import WorkflowEnvironment
from tests.apps import contract, published
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


async def _waiting(client: Client, instance_id: str) -> None:
    async def waits() -> bool:
        return (await client.status(instance_id)).status == "waiting_for_message"

    # (eventually's Awaitable[T] | T signature leaves mypy no T for a coroutine function)
    await eventually(cast(Any, waits), message=f"{instance_id} waits", timeout=10)


async def test_values_are_read_without_a_worker_and_a_wait_is_woken_by_the_publish(database: Database) -> None:
    async with Client(database=database, result_poll_interval=30) as client:
        async with running_worker(database, published.app):
            order = await client.start(published.published_order, customer="c-1", region="eu", rank=2)
            later = await client.start(published.publishes_later)
            await _waiting(client, order.instance_id)
            await _waiting(client, later.instance_id)
        # no worker runs now: the values are read from their table
        assert await client.get_value(order.instance_id, "customer") == "c-1"
        assert await client.get_value(order.instance_id, "priority") == 2
        status = await client.get_status(order.instance_id)
        assert isinstance(status, PublishedStatus)
        assert (status.text, status.progress) == ("awaiting payment", 0.4) and status.updated_at is not None
        assert await client.get_status(later.instance_id) is None
        with pytest.raises(ValueNotPublishedError, match="has not published 'receipt'"):
            await client.get_value(order.instance_id, "receipt")
        with pytest.raises(WorkflowNotFoundError):
            await client.get_value("no-such-instance", "customer")
        began = time.monotonic()
        with pytest.raises(ValueNotPublishedError, match=r"within 0\.3 s"):
            await client.get_value(later.instance_id, "answer", timeout=0.3)
        assert 0.25 < time.monotonic() - began < 5

        async with running_worker(database, published.app):
            waiter = asyncio.create_task(client.get_value(later.instance_id, "answer", timeout=20))
            await asyncio.sleep(0.5)  # the waiter listens and has read: nothing yet
            assert not waiter.done()
            sent = time.monotonic()
            await client.send_message(later.instance_id, "go", {"n": 42})
            assert await waiter == {"n": 42}
            woken_after = time.monotonic() - sent
            assert woken_after < 5, f"woken after {woken_after:.2f} s: by the poll, not the NOTIFY"

            await client.send_message(order.instance_id, "go", "card")
            assert await client.result(order.instance_id, timeout=10) == {"customer": "c-1"}
        # the latest wins, and the values outlive the instance's end
        status = await client.get_status(order.instance_id)
        assert status is not None and (status.text, status.progress) == ("paid", 1.0)
        assert await client.values(order.instance_id) == {
            "customer": "c-1",
            "priority": 2,
            "receipt": {"paid": "card"},
            "region": "eu",
            "status": {"text": "paid", "progress": 1.0},
        }
        # a finished instance that never published the key: no waiting for the timeout
        began = time.monotonic()
        with pytest.raises(ValueNotPublishedError):
            await client.get_value(order.instance_id, "never", timeout=20)
        assert time.monotonic() - began < 5


async def test_list_where_finds_by_declared_attributes_newest_first(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client, running_worker(database, published.app):
        ids = {}
        for n, (customer, region, priority) in enumerate(
            [("c-1", "eu", 1), ("c-2", "eu", 1), ("c-1", "us", 2), ("c-1", "eu", 2)]
        ):
            started = await client.start(
                published.published_order, instance_id=f"o-{n}", customer=customer, region=region, rank=priority
            )
            ids[n] = started.instance_id
            await _waiting(client, started.instance_id)

        async def found(**where: str | int) -> list[str]:
            return [row.id for row in await client.list(where=where)]

        assert await found(customer="c-1") == ["o-3", "o-2", "o-0"]  # newest first
        assert await found(customer="c-1", region="eu") == ["o-3", "o-0"]  # every pair
        assert await found(region="eu", priority=1) == ["o-1", "o-0"]  # an int compared as its text
        assert await found(region="eu", priority="1") == ["o-1", "o-0"]
        assert await found(customer="c-9") == []
        assert await found(receipt="x") == []  # not declared: never indexed
        assert [r.id for r in await client.list(where={"customer": "c-1"}, limit=1)] == ["o-3"]
        assert await client.list(where={"customer": "c-1"}, status="completed") == []
        assert [r.id for r in await client.list(where={"customer": "c-1"}, workflow="published_order")] == [
            "o-3",
            "o-2",
            "o-0",
        ]
        with pytest.raises(InvalidInputError, match="takes a str, int, float or bool"):
            await client.list(where={"customer": ["c-1"]})  # type: ignore[dict-item]
        with pytest.raises(InvalidInputError, match="key must be a non-empty str"):
            await client.list(where={"": "c-1"})

        # the lookup index serves the page
        plan = "\n".join(
            str(row[0])
            for row in sql.execute(
                "EXPLAIN SELECT instance_id FROM kenning_search_attributes WHERE key = 'customer' AND value = 'c-1' "
                "ORDER BY created_at DESC, instance_id LIMIT 50"
            ).fetchall()
        )
        assert "kenning_search_attributes_lookup" in plan or "Seq Scan" in plan  # tiny table: either


async def test_retention_deletes_values_with_the_instance(database: Database, sql: Sql) -> None:
    async with Client(database=database) as client, running_worker(database, published.app):
        started = await client.start(published.published_order, customer="c-1", region="eu")
        await _waiting(client, started.instance_id)
        await client.send_message(started.instance_id, "go", "card")
        await client.result(started.instance_id, timeout=10)
    sql.execute(
        "UPDATE kenning_instances SET finished_at = now() - interval '2 days' WHERE id = %s", (started.instance_id,)
    )
    async with database.transaction() as conn:
        assert len(await published_sql.values_of(conn, started.instance_id)) == 5
        expired = await retention_sql.instances_expire(conn, default_seconds=86400, limit=10)
    assert expired.instances == 1
    counts = sql.execute(
        "SELECT (SELECT count(*) FROM kenning_values), (SELECT count(*) FROM kenning_search_attributes)"
    ).fetchone()
    assert counts == (0, 0)
    with pytest.raises(WorkflowNotFoundError):
        await Client(database=database).get_value(started.instance_id, "customer")


@pytest.mark.parametrize("backend", ["memory", "postgresql"])
async def test_the_testing_environment_reads_values_on_either_backend(backend: str, database_url: str) -> None:
    url = database_url if backend == "postgresql" else None
    async with WorkflowEnvironment(published.app, database_url=url, migrate=False) as env:
        first = await env.start(published.published_order, instance_id="o-1", customer="c-1", region="eu")
        await env.start(published.published_order, instance_id="o-2", customer="c-1", region="us", rank=3)
        assert await first.get_value("customer") == "c-1"
        assert await env.get_value("o-2", "priority") == 3
        status = await env.get_status("o-1")
        assert status is not None and (status.text, status.progress) == ("awaiting payment", 0.4)
        with pytest.raises(ValueNotPublishedError):
            await env.get_value("o-1", "receipt")
        with pytest.raises(WorkflowNotFoundError):
            await env.get_value("nobody", "customer")
        assert [h.instance_id for h in await env.instances(where={"customer": "c-1"})] == ["o-1", "o-2"]
        assert [h.instance_id for h in await env.instances(where={"customer": "c-1", "priority": 3})] == ["o-2"]
        await env.send_message("o-1", "go", "card")
        assert await first.result() == {"customer": "c-1"}
        assert (await first.state()).values["receipt"] == {"paid": "card"}
        done = await env.get_status("o-1")
        assert done is not None and done.text == "paid"


async def test_a_start_sets_search_attributes_before_any_worker_runs(database: Database) -> None:
    async with Client(database=database) as client:
        tagged = published.published_order.options(search_attributes={"customer": "c-7", "region": "ap"})
        started = await client.start(tagged, customer="c-7", region="ap", rank=1)
        found = await client.list(where={"customer": "c-7", "region": "ap"})
        assert [row.id for row in found] == [started.instance_id]
        assert (found[0].status, await client.get_value(started.instance_id, "region")) == ("pending", "ap")
        with pytest.raises(InvalidInputError, match="'color' is not declared by the workflow"):
            await client.start(
                published.published_order.options(search_attributes={"color": "red"}),
                customer="c-8",
                region="ap",
                rank=1,
            )
        with pytest.raises(InvalidInputError, match="takes a str, int, float or bool"):
            await client.start(
                published.published_order.options(search_attributes={"customer": [1]}),
                customer="c-8",
                region="ap",
                rank=1,
            )
        assert [row.id for row in await client.list(where={"customer": "c-8"})] == []  # refused whole


async def test_a_where_list_reads_a_chains_run_as_the_plain_list_does(database_url: str) -> None:
    async with WorkflowEnvironment(contract.app, database_url=database_url, migrate=False) as env:
        await env.start(contract.entity, instance_id="entity", owner="ann")
        for run in (1, 2):
            await env.request("entity", "bump", None, request_id=f"b{run}", timeout=60)
    async with Client(database_url) as client:
        plain = [row for row in await client.list() if row.id == "entity"]
        found = await client.list(where={"owner": "ann"})
        assert [(row.id, row.run) for row in found] == [(plain[0].id, plain[0].run)] == [("entity", 3)]
