"""The relayer publishing to the machine's RabbitMQ (``amqp://`` broker URLs), as a real
process: the CloudEvents RabbitMQ binding in both content modes, publisher confirms, a
crash after the confirm, the broker unreachable and connections cut, unroutable events
dead-lettered with the broker's answer, and the start-time errors. Each module works in a
throwaway vhost; each test in exchanges and queues of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kenning.db import Database
from kenning.observability.faults import CRASH_EXIT_CODE
from kenning_relayer.amqp import AmqpAddress, AmqpTarget
from kenning_relayer.publish import RetrySchedule
from kenning_relayer.settings import RelayerSettings
from tests.brokers import (
    RabbitVhost,
    amqp_bound_queue,
    amqp_channel,
    amqp_messages,
    amqp_queue_drained,
    close_rabbitmq_connections,
    rabbitmq_unreachable_reason,
    rabbitmq_vhost,
    tcp_proxy,
    unique_name,
    with_query,
)
from tests.logguard import expect_log
from tests.relayer_support import (
    awkward_event_expected,
    awkward_event_in_the_inbox,
    ce_headers,
    check_outbox_invariants,
    delivered_once,
    insert_awkward_event,
    insert_events,
    insert_varied_events,
    outbox_row,
    placed_attributes,
    published_across_a_cut,
    relayer_process,
    relayer_without,
    relaying,
    retried_as_unreachable,
    running_relayer,
    statuses,
)
from tests.sources_support import start_consuming_ingress
from tests.support import ProcessPool, eventually

SQL = psycopg.Connection[tuple[object, ...]]


BROKER = ("--request-timeout-seconds", "3")


CRASH_AFTER_SEND = "relayer.after_send=crash@1"


pytestmark = pytest.mark.skipif(rabbitmq_unreachable_reason() is not None, reason=str(rabbitmq_unreachable_reason()))


@pytest.fixture(scope="module")
def vhost() -> Iterator[RabbitVhost]:
    with rabbitmq_vhost("kenning-relayer") as made:
        yield made


def by_id(messages: list[Any]) -> dict[str, Any]:
    return {m.message_id: m for m in messages}


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_events_are_confirmed_in_the_rabbitmq_binding(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, vhost: RabbitVhost, mode: str
) -> None:
    exchange = unique_name("events")
    async with amqp_channel(vhost.url) as channel:
        queue = await amqp_bound_queue(channel, exchange, "kenning.#")
        url = vhost.relayer_url(exchange=exchange, routing_key="kenning.{type}")
        async with relaying(mode, processes, database, database_url, url, *BROKER):
            ids = await insert_varied_events(database)
            messages = await amqp_messages(queue, len(ids))
            await eventually(lambda: statuses(sql) == {"published": len(ids)}, timeout=30, message="all confirmed")
    got = by_id(messages)
    assert set(got) == set(ids.values())  # the AMQP message id is the CloudEvent id
    # one instance's events arrive in creation order, each batch after the one before
    order = [m.message_id for m in messages if m.message_id in (ids["first"], ids["second"], ids["third"])]
    assert order == [ids["first"], ids["second"], ids["third"]]
    placed = got[ids["json"]]
    assert placed.routing_key == "kenning.order.placed"  # the template, filled from the event
    assert placed.delivery_mode == 2  # persistent
    if mode == "binary":
        headers = dict(placed.headers)
        time = headers.pop("ce-time")
        assert isinstance(time, str) and time.endswith("Z")
        attributes = placed_attributes(ids["json"], binary=True)  # header values are strings in this binding
        assert placed.content_type == attributes.pop("datacontenttype")  # the content_type property, not a header
        assert headers == ce_headers(attributes)
        assert json.loads(placed.body) == {"order_id": "o-9", "total": 42}
        blob = got[ids["blob"]]
        assert (blob.content_type, blob.body) == (None, b"\xff")
        text = got[ids["text"]]
        assert (text.content_type, text.body) == ("text/plain", b"thank you")
    else:
        assert {m.content_type for m in messages} == {"application/cloudevents+json"}
        assert all(not m.headers for m in messages)
        event = json.loads(placed.body)
        event.pop("time")
        assert event == {**placed_attributes(ids["json"], binary=False), "data": {"order_id": "o-9", "total": 42}}
        assert json.loads(got[ids["blob"]].body)["data_base64"] == "/w=="
    check_outbox_invariants(sql)


async def test_kenning_to_kenning_relayer_to_a_queue_to_an_amqp_source_keeps_every_attribute(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, vhost: RabbitVhost
) -> None:
    """The relayer's binary mode read by ``kenning ingress --source amqp://``: the inbox row
    holds the outbox event's attributes exactly."""
    queue = unique_name("inbox")
    async with amqp_channel(vhost.url) as channel:
        await channel.declare_queue(queue, durable=True)
        start_consuming_ingress(processes, database_url, with_query(vhost.url, queue=queue))
        event_id = await insert_awkward_event(database)
        async with running_relayer(database, vhost.relayer_url(routing_key=queue)):  # the default exchange
            await eventually(lambda: statuses(sql) == {"published": 1}, timeout=20, message="confirmed")
        await eventually(lambda: awkward_event_in_the_inbox(sql, event_id) is not None, timeout=20, message="stored")
        await channel.queue_delete(queue)
    assert awkward_event_in_the_inbox(sql, event_id) == awkward_event_expected(event_id)


async def test_a_relayer_killed_after_the_confirm_sends_the_same_event_again(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, vhost: RabbitVhost
) -> None:
    exchange = unique_name("events")
    lease = ("--lease-seconds", "1", *BROKER)
    async with amqp_channel(vhost.url) as channel:
        queue = await amqp_bound_queue(channel, exchange, "#")
        url = vhost.relayer_url(exchange=exchange)
        ids = await insert_events(database, 3)
        first = relayer_process(processes, database_url, url, *lease, env={"KENNING_FAULTS": CRASH_AFTER_SEND})
        assert await asyncio.to_thread(first.wait, 60) == CRASH_EXIT_CODE, processes.log_of(first)
        confirmed = await amqp_messages(queue, 3)
        assert sorted(m.message_id for m in confirmed) == sorted(ids)  # the broker has them ...
        assert statuses(sql) == {"publishing": 3}  # ... the outbox does not know it
        relayer_process(processes, database_url, url, *lease)
        await eventually(lambda: statuses(sql) == {"published": 3}, timeout=30, message="published by another relayer")
        again = await amqp_messages(queue, 3)
        assert await amqp_queue_drained(queue) == []
    # at least once: the same id (and ce-id) again; AMQP consumers deduplicate by (source, id)
    assert sorted(m.message_id for m in again) == sorted(ids)
    assert {m.headers["ce-id"] for m in again} == set(ids)
    assert all(outbox_row(sql, i)["attempts"] == 2 for i in ids)
    check_outbox_invariants(sql)


async def test_a_broker_down_at_start_and_cut_connections_lose_nothing(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, vhost: RabbitVhost
) -> None:
    exchange, queue_name = unique_name("events"), unique_name("q")
    async with amqp_channel(vhost.url) as channel:
        await amqp_bound_queue(channel, exchange, "#", queue=queue_name)
    async with tcp_proxy(vhost.url, 5672, started=False) as network:
        url = network.url(vhost.relayer_url(exchange=exchange))
        relayer_process(processes, database_url, url, "--max-attempts", "1000", "--batch-size", "5", *BROKER)
        ids = await insert_events(database, 5)
        # down at start: no crash, the rows are retried with back-off
        await eventually(
            lambda: retried_as_unreachable(sql, ids), timeout=30, message="attempts against a broker that is down"
        )
        await network.start()
        await eventually(lambda: statuses(sql) == {"published": 5}, timeout=30, message="published once it is up")
        # the broker closes the relayer's connection (as a restart does): it connects again
        await asyncio.to_thread(close_rabbitmq_connections, vhost)
        ids += await insert_events(database, 5)
        await eventually(lambda: statuses(sql) == {"published": 10}, timeout=30, message="published after the close")
        # the network goes away mid-run and comes back
        ids += await published_across_a_cut(network, database, sql)
    async with amqp_channel(vhost.url) as channel:
        queue = await channel.get_queue(queue_name)
        received = await amqp_messages(queue, 15)
        received += await amqp_queue_drained(queue)
    assert {m.message_id for m in received} == set(ids)  # nothing lost (a re-send is allowed)
    log = "".join(processes.log_of(p) for p, _ in processes.procs)
    assert '"relayer.broker_unreachable"' in log and '"relayer.broker_connection_lost"' in log
    check_outbox_invariants(sql)


async def test_unroutable_events_are_retried_then_dead_lettered_with_the_brokers_answer(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, vhost: RabbitVhost
) -> None:
    expect_log("outbox.dead_lettered")
    exchange = unique_name("events")
    async with amqp_channel(vhost.url) as channel:
        queue = await amqp_bound_queue(channel, exchange, "order.#")
        url = vhost.relayer_url(exchange=exchange)
        relayer_process(processes, database_url, url, "--max-attempts", "3", *BROKER)
        lost = await insert_events(database, 2, event_type="nobody.listens")
        routed = await insert_events(database, 2, event_type="order.placed")
        await eventually(lambda: statuses(sql) == {"failed": 2, "published": 2}, timeout=30, message="outcomes")
        received = await amqp_messages(queue, 2)
    assert sorted(m.message_id for m in received) == sorted(routed)  # the others did not wait for them
    for event_id in lost:
        row = outbox_row(sql, event_id)
        assert row["attempts"] == 3
        assert str(row["last_error"]) == (
            "gave up after 3 attempts; last error: unroutable: 312 NO_ROUTE "
            f"(exchange '{exchange}', routing key 'nobody.listens')"
        )
    check_outbox_invariants(sql)


async def test_a_missing_exchange_is_the_brokers_refusal(vhost: RabbitVhost) -> None:
    """In process, no database: one attempt and its outcome (the broker's 404, retried)."""
    address = AmqpAddress.parse(vhost.relayer_url(exchange="no-such-exchange"))
    outcome = await delivered_once(
        AmqpTarget(address, RelayerSettings(request_timeout_seconds=3), RetrySchedule(5, 0.02, 0.1))
    )
    assert outcome.status == "pending"
    assert outcome.error == (
        f"broker refused: ChannelNotFoundEntity: NOT_FOUND - no exchange 'no-such-exchange' in vhost '{vhost.name}'"
    )


def test_without_aio_pika_the_relayer_stops_at_start_naming_the_extra(tmp_path: Path) -> None:
    result = relayer_without("aio_pika", "amqp://guest:secret@127.0.0.1:5672/?exchange=x", tmp_path)
    assert result.code == 2, result
    assert result.stderr.strip() == (
        "kenning relayer: amqp:// broker URLs need the aio-pika client: pip install 'kenning[amqp]'"
    )
