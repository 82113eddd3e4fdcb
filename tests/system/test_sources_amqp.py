"""``kenning ingress --source amqp://...``: a RabbitMQ queue into the inbox, against the
machine's RabbitMQ (skipped with the reason when it does not answer).

The module shares one vhost, one database and one ingress process consuming a queue per
test (``--source`` is repeatable), so a test costs its messages, not a process start: an
event lands once and starts and wakes a workflow (a real worker), a duplicate is stored
once, a malformed message goes to the dead-letter queue with the error the HTTP path
answers and the next message flows, the ingress holds at most ``prefetch`` messages while
the inbox cannot take them, a queue deleted and declared again under the source is
consumed again, and each hostile message (properties aiormq cannot decode, a ``ce-time``
out of range, a body over HTTP's limit; 40 of them, over the prefetch) is rejected once
while the 10 events behind it are stored. Tests that need an ingress of their own start one: killed between the
inbox commit and the ack (the message comes back and is stored once), and cut off from
RabbitMQ with messages in flight (all stored once, nothing left on the queue).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from cloudevents.core.bindings import rabbitmq
from cloudevents.core.formats.json import JSONFormat

from kenning_ingress.sources.addresses import parse_source
from tests.brokers import (
    RabbitVhost,
    amqp_channel,
    amqp_messages,
    rabbitmq_queue_counts,
    rabbitmq_unreachable_reason,
    rabbitmq_vhost,
    rabbitmqctl_available,
    tcp_proxy,
    with_query,
)
from tests.ingress_support import Ingress, cloned_database, cloud_event
from tests.metrics_support import scrape_until, value
from tests.sources_support import consuming, http_answer, log_events, start_consuming_ingress
from tests.support import ProcessPool, check_invariants, eventually

Sql = psycopg.Connection[tuple[object, ...]]
FORMAT = JSONFormat()
HELD_PREFETCH = 3

pytestmark = pytest.mark.skipif(rabbitmq_unreachable_reason() is not None, reason=str(rabbitmq_unreachable_reason()))


@pytest.fixture(scope="module")
def vhost() -> Iterator[RabbitVhost]:
    with rabbitmq_vhost("kenning-sources") as made:
        yield made


@pytest.fixture(scope="module")
def module_database(pg_server_url: str, template_database: str) -> Iterator[str]:
    with cloned_database(pg_server_url, template_database) as url:
        yield url


@pytest.fixture
def db(module_database: str) -> Iterator[Sql]:
    with psycopg.connect(module_database, autocommit=True) as conn:
        yield conn


@dataclass
class Shared:
    """The module's ingress and the queue each test consumes through it."""

    ingress: Ingress
    pool: ProcessPool
    queues: dict[str, str]  # test's key -> queue name


@pytest.fixture(scope="module")
def shared(vhost: RabbitVhost, module_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    keys = ("flow", "dead", "held", "deleted", "stall", *HOSTILE)
    queues = {key: f"events-{key}-{uuid.uuid4().hex[:8]}" for key in keys}
    for key, name in queues.items():
        asyncio.run(declare_queue(vhost, name, dead_letters=key not in ("flow", "held", "deleted")))
    urls = [
        source_url(vhost, name, **({"prefetch": str(HELD_PREFETCH)} if key == "held" else {}))
        for key, name in queues.items()
    ]
    pool = ProcessPool(str(tmp_path_factory.mktemp("sources-amqp")))  # no per-test guard: checked below
    try:
        ingress = start_consuming_ingress(pool, module_database, *urls)
        yield Shared(ingress, pool, queues)
    finally:
        pool.stop_all()
    errors = [line for line in pool.log_of(ingress.process).splitlines() if not _expected_line(line)]
    assert errors == [], "the module's ingress logged:\n" + "\n".join(errors[:20])


def _expected_line(line: str) -> bool:
    """Anything but an error line or a traceback from the module's ingress."""
    if not line.startswith("{"):
        return "Traceback" not in line and not line.startswith(("ERROR", "CRITICAL"))
    record = json.loads(line)
    return record.get("level") not in ("error", "critical") and "exception" not in record


async def consuming_all(shared: Shared) -> None:
    await eventually(
        lambda: len(log_events(shared.pool, shared.ingress.process, "source.consuming")) >= len(shared.queues),
        timeout=30,
        message="the module's ingress consumes every queue",
    )


async def declare_queue(vhost: RabbitVhost, name: str, *, dead_letters: bool = False) -> str:
    """A durable queue (with a fanout dead-letter exchange and its queue ``<name>.dead``
    when asked); returns its name."""
    import aio_pika

    async with amqp_channel(vhost.url) as channel:
        arguments: dict[str, Any] = {}
        if dead_letters:
            exchange = await channel.declare_exchange(f"{name}.dlx", aio_pika.ExchangeType.FANOUT, durable=True)
            dead = await channel.declare_queue(f"{name}.dead", durable=True)
            await dead.bind(exchange)
            arguments["x-dead-letter-exchange"] = f"{name}.dlx"
        await channel.declare_queue(name, durable=True, arguments=arguments)
    return name


async def publish(vhost: RabbitVhost, queue: str, *messages: tuple[dict[str, Any], str | None, bytes]) -> None:
    """Publish ``(headers, content_type, body)`` messages to ``queue``, each confirmed."""
    import aio_pika

    async with amqp_channel(vhost.url) as channel:
        for headers, content_type, body in messages:
            message = aio_pika.Message(body, headers=headers, content_type=content_type, delivery_mode=2)
            await channel.default_exchange.publish(message, routing_key=queue)


def binary(event_type: str, data: Any, **attributes: Any) -> tuple[dict[str, Any], str | None, bytes]:
    """The event in the RabbitMQ binding's binary mode, as the CloudEvents SDK writes it."""
    message = rabbitmq.to_binary(cloud_event(event_type, data, **attributes), FORMAT)
    return dict(message.headers), message.content_type, message.body


def structured(event_type: str, data: Any, **attributes: Any) -> tuple[dict[str, Any], str | None, bytes]:
    message = rabbitmq.to_structured(cloud_event(event_type, data, **attributes), FORMAT)
    return dict(message.headers), message.content_type, message.body


def depth_is(vhost: RabbitVhost, queue: str, expected: int) -> Callable[[], Awaitable[bool]]:
    """A predicate for ``eventually``: ``queue`` holds ``expected`` ready messages."""

    async def check() -> bool:
        return await queue_depth(vhost, queue) == expected

    return check


async def queue_depth(vhost: RabbitVhost, queue: str) -> int:
    """Messages ready on ``queue`` (not counting those delivered and unacked)."""
    async with amqp_channel(vhost.url) as channel:
        declared = await channel.get_queue(queue, ensure=True)
        return int(declared.declaration_result.message_count or 0)


async def settled(vhost: RabbitVhost, queue: str) -> None:
    """Wait until ``queue`` holds nothing, ready or unacknowledged (each message acked)."""
    if rabbitmqctl_available():
        await eventually(
            lambda: rabbitmq_queue_counts(vhost, queue) == (0, 0), timeout=30, message=f"{queue} empty and acked"
        )
    else:
        empty: bool = await eventually(depth_is(vhost, queue, 0), timeout=30, message=f"{queue} empty")
        assert empty


def death_reason(headers: Mapping[str, Any]) -> Any:
    """Why RabbitMQ dead-lettered a message (its ``x-death`` header's first entry)."""
    deaths: Any = headers["x-death"]
    return deaths[0]["reason"]


def source_url(vhost: RabbitVhost, queue: str, **options: str) -> str:
    return with_query(vhost.url, queue=queue, **options)


def instance_of(sql: Sql, workflow: str) -> tuple[str, Any] | None:
    row = sql.execute("SELECT status, result FROM kenning_instances WHERE workflow_name = %s", (workflow,)).fetchone()
    return (str(row[0]), row[1]) if row else None


def stored(sql: Sql, event_type: str) -> list[str]:
    """The ids of the inbox rows of ``event_type`` (each test sends types of its own)."""
    rows = sql.execute("SELECT event_id FROM kenning_inbox WHERE event_type = %s ORDER BY id", (event_type,))
    return [str(r[0]) for r in rows.fetchall()]


async def test_an_event_from_rabbitmq_starts_and_wakes_a_workflow_and_a_duplicate_is_stored_once(
    processes: ProcessPool, module_database: str, db: Sql, vhost: RabbitVhost, shared: Shared
) -> None:
    queue = shared.queues["flow"]
    processes.worker(module_database, "tests.apps.brokers")
    order = binary("broker.order", {"order_id": "o-1"}, source="/shop", id="order-o-1")
    # the same event twice (a publisher's retry), and the payment in structured mode
    await publish(vhost, queue, order, order, structured("broker.paid", {"order_id": "o-1", "amount": 42}))

    await eventually(lambda: (instance_of(db, "broker.order") or ("",))[0] == "completed", timeout=30)
    row = instance_of(db, "broker.order")
    assert row is not None
    result = row[1]["result"]
    assert result == {"order_id": "o-1", "amount": 42, "paid_via": "tests", "answer_id": result["answer_id"]}
    assert stored(db, "broker.order") == ["order-o-1"]  # the duplicate stored once
    assert len(stored(db, "broker.paid")) == 1
    started = db.execute("SELECT count(*) FROM kenning_instances").fetchone()
    assert started is not None and started[0] == 1
    await settled(vhost, queue)  # every message acked
    check_invariants(db, settled=False)  # the answer waits in the outbox: no relayer here


async def test_an_ingress_killed_after_the_inbox_commit_before_the_ack_gets_the_message_again_and_stores_it_once(
    processes: ProcessPool, module_database: str, db: Sql, vhost: RabbitVhost
) -> None:
    queue = await declare_queue(vhost, f"events-crash-{uuid.uuid4().hex[:8]}")
    url = source_url(vhost, queue)
    doomed = start_consuming_ingress(
        processes, module_database, url, env={"KENNING_FAULTS": "source.after_commit=crash@1"}
    )
    await publish(vhost, queue, binary("broker.crash", {"n": 1}, id="crash-1"))
    assert doomed.process.wait(timeout=30) == 137  # committed, then killed before its ack
    assert stored(db, "broker.crash") == ["crash-1"]
    # RabbitMQ took the unacked message back with the connection
    back: bool = await eventually(depth_is(vhost, queue, 1), timeout=30, message="the message is back on the queue")
    assert back

    start_consuming_ingress(processes, module_database, url)
    await settled(vhost, queue)  # taken again and acked
    assert stored(db, "broker.crash") == ["crash-1"]  # delivered twice, stored once
    assert log_events(processes, doomed.process, "fault.fired")[0]["point"] == "source.after_commit"


MALFORMED: list[tuple[str, dict[str, str], str | None, bytes]] = [
    # (what, headers, content type, body): each also posted to the HTTP endpoint as ce- headers
    ("no id", {"ce-specversion": "1.0", "ce-type": "t.bad", "ce-source": "/s"}, "application/json", b"{}"),
    (
        "bad JSON",
        {"ce-specversion": "1.0", "ce-type": "t.bad", "ce-source": "/s", "ce-id": "j"},
        "application/json",
        b"{",
    ),
    (
        "old spec",
        {"ce-specversion": "0.3", "ce-type": "t.bad", "ce-source": "/s", "ce-id": "o"},
        "application/json",
        b"{}",
    ),
    ("structured", {}, "application/cloudevents+json", b'{"specversion": "1.0", "id": "x", "source": "/s"}'),
]


async def test_a_malformed_message_is_dead_lettered_with_the_http_error_and_the_next_one_flows(
    db: Sql, vhost: RabbitVhost, shared: Shared
) -> None:
    import aio_pika

    queue = shared.queues["dead"]
    bad = [(headers, content_type, body) for _, headers, content_type, body in MALFORMED]
    await publish(vhost, queue, *bad, binary("t.good", {"ok": True}, id="good-1"))

    await eventually(lambda: stored(db, "t.good") == ["good-1"], timeout=30, message="the good message is stored")
    async with amqp_channel(vhost.url) as channel:
        dead_queue = await channel.get_queue(f"{queue}.dead", ensure=True)
        dead: list[aio_pika.abc.AbstractIncomingMessage] = await amqp_messages(dead_queue, len(MALFORMED))
    assert sorted(m.body for m in dead) == sorted(body for *_, body in bad)
    assert [death_reason(m.headers) for m in dead] == ["rejected"] * len(MALFORMED)

    def rejected() -> list[dict[str, Any]]:
        return log_events(shared.pool, shared.ingress.process, "source.message_rejected")

    await eventually(lambda: len(rejected()) == len(MALFORMED), timeout=30)
    answered = [
        http_answer(shared.ingress, {**headers, "content-type": content_type or ""}, body)
        for _, headers, content_type, body in MALFORMED
    ]
    assert sorted((r["error"], r["error_type"]) for r in rejected()) == sorted(answered)
    assert "missing required attribute 'id'" in [error for error, _ in answered]
    assert await queue_depth(vhost, queue) == 0

    # the ingress's /metrics counts both outcomes, by source
    source = parse_source(source_url(vhost, queue)).name
    # the source counts a stored message just after its commit, which is what we saw
    found = await scrape_until(
        f"{shared.ingress.url}/metrics",
        lambda f: value(f, "kenning_source_messages_total", source=source, outcome="stored") > 0,
        "the stored message counted",
    )
    assert value(found, "kenning_source_messages_total", source=source, outcome="rejected") == len(MALFORMED)
    assert value(found, "kenning_source_messages_total", source=source, outcome="stored") == 1
    assert value(found, "kenning_source_settle_failures_total", source=source) == 0


async def test_the_ingress_holds_at_most_prefetch_messages_while_the_inbox_cannot_take_them(
    module_database: str, db: Sql, vhost: RabbitVhost, shared: Shared
) -> None:
    queue = shared.queues["held"]
    await consuming_all(shared)
    with psycopg.connect(module_database) as blocker:
        blocker.execute("LOCK TABLE kenning_inbox IN SHARE ROW EXCLUSIVE MODE")  # inserts wait
        await publish(vhost, queue, *(binary("t.held", {"n": n}, id=f"held-{n}") for n in range(10)))
        held: bool = await eventually(depth_is(vhost, queue, 10 - HELD_PREFETCH), timeout=30, message="3 of 10 taken")
        assert held
        if rabbitmqctl_available():
            # RabbitMQ's own count, polled: the ingress holds its prefetch and takes no more
            for _ in range(3):
                assert rabbitmq_queue_counts(vhost, queue) == (10 - HELD_PREFETCH, HELD_PREFETCH)
        else:
            for _ in range(5):
                assert await queue_depth(vhost, queue) == 10 - HELD_PREFETCH
        blocker.rollback()
    await eventually(lambda: len(stored(db, "t.held")) == 10, timeout=30)
    await settled(vhost, queue)


async def test_a_queue_deleted_and_declared_again_under_the_source_is_consumed_again(
    db: Sql, vhost: RabbitVhost, shared: Shared
) -> None:
    # RabbitMQ cancels the consumer of a deleted queue (basic.cancel) and keeps the
    # connection and channel open: the source must notice and consume the new queue
    queue = shared.queues["deleted"]
    await consuming_all(shared)
    async with amqp_channel(vhost.url) as channel:
        await channel.queue_delete(queue)
    await declare_queue(vhost, queue)
    await publish(vhost, queue, binary("t.requeued", {}, id="after-delete"))
    await eventually(lambda: stored(db, "t.requeued") == ["after-delete"], timeout=30, message="consumed again")
    await settled(vhost, queue)
    assert log_events(shared.pool, shared.ingress.process, "source.disconnected")


async def test_a_network_cut_with_messages_in_flight_loses_nothing_and_stores_each_once(
    processes: ProcessPool, module_database: str, db: Sql, vhost: RabbitVhost
) -> None:
    queue = await declare_queue(vhost, f"events-cut-{uuid.uuid4().hex[:8]}")
    ids = [f"cut-{n}" for n in range(12)]
    async with tcp_proxy(vhost.url, 5672) as proxy:
        ingress = start_consuming_ingress(
            processes, module_database, with_query(proxy.url(vhost.url), queue=queue, prefetch="4")
        )
        await eventually(lambda: consuming(processes, ingress.process), timeout=30)
        with psycopg.connect(module_database) as blocker:
            blocker.execute("LOCK TABLE kenning_inbox IN SHARE ROW EXCLUSIVE MODE")  # inserts wait
            await publish(vhost, queue, *(binary("t.cut", {}, id=event_id) for event_id in ids))
            taken: bool = await eventually(depth_is(vhost, queue, len(ids) - 4), timeout=30, message="4 in flight")
            assert taken
            await proxy.stop()  # the network goes: RabbitMQ takes the 4 back
            back: bool = await eventually(depth_is(vhost, queue, len(ids)), timeout=30, message="the 4 are back")
            assert back
            # the 4 handlers were cancelled with their connection (aiormq's tasks), or commit
            # now and their acks find no connection (source.ack_failed, a warning): either
            # way RabbitMQ delivers them again
            blocker.rollback()
        await proxy.start()
        await eventually(lambda: sorted(stored(db, "t.cut")) == sorted(ids), timeout=30, message="all stored")
        await settled(vhost, queue)
    assert sorted(stored(db, "t.cut")) == sorted(ids)  # the 4 delivered twice, stored once
    assert len(log_events(processes, ingress.process, "source.consuming")) == 2  # connected again


# ------------------------------------------------------------------ hostile messages


class FarTimestamp(datetime):
    """A moment pamqp encodes as the AMQP timestamp 2**63 seconds, which any client but
    Python's can send and which no ``datetime`` holds: pamqp cannot decode it back."""

    def timestamp(self) -> float:
        return float(2**63)


FAR = FarTimestamp(2000, 1, 1, tzinfo=UTC)
MAX_BODY_BYTES = 1024 * 1024  # the ingress's default --max-body-bytes, HTTP's limit


def hostile_message(kind: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """``(headers, other properties, body)`` of a message of ``kind`` whose event is valid
    but for the one thing ``kind`` names."""
    headers, content_type, body = binary(f"t.hostile.{kind}", {"n": 0}, id=f"{kind}-hostile")
    properties: dict[str, Any] = {"content_type": content_type}
    if kind == "timestamp-property":  # the message's own timestamp property
        properties["timestamp"] = FAR
    elif kind == "timestamp-header":  # a header the event does not even read
        headers["x-sent-at"] = FAR
    elif kind == "ce-time-integer":  # the AMQP 1.0 binding's milliseconds, far out of range
        headers["ce-time"] = 2**62
    elif kind == "oversized":  # 20 MB of JSON data, where HTTP takes at most 1 MB
        body = json.dumps("x" * (20 * 1024 * 1024)).encode()
    return headers, properties, body


# kind -> what the rejection's error says, and its type
HOSTILE: dict[str, tuple[str, str]] = {
    "timestamp-property": ("properties cannot be decoded: year 292278994 is out of range", "invalid_encoding"),
    "timestamp-header": ("properties cannot be decoded: year 292278994 is out of range", "invalid_encoding"),
    "ce-time-integer": ("header ce-time holds 4611686018427387904 milliseconds", "invalid_attribute"),
    "oversized": (f"message body over {MAX_BODY_BYTES} bytes (--max-body-bytes)", "payload_too_large"),
}


async def publish_raw(vhost: RabbitVhost, queue: str, *messages: tuple[dict[str, Any], dict[str, Any], bytes]) -> None:
    """Publish ``(headers, properties, body)`` through aiormq, which encodes what aio-pika's
    ``Message`` would refuse (a timestamp no ``datetime`` holds), each confirmed."""
    from pamqp.commands import Basic

    async with amqp_channel(vhost.url) as channel:
        underlay = await channel.get_underlay_channel()
        for headers, properties, body in messages:
            await underlay.basic_publish(
                body, routing_key=queue, properties=Basic.Properties(headers=headers, delivery_mode=2, **properties)
            )


def valid_messages(event_type: str, count: int) -> list[tuple[dict[str, Any], dict[str, Any], bytes]]:
    messages = [binary(event_type, {"n": n}, id=f"{event_type}-{n}") for n in range(count)]
    return [(headers, {"content_type": content_type}, body) for headers, content_type, body in messages]


async def dead_count(vhost: RabbitVhost, queue: str) -> int:
    """Messages on ``queue``'s dead-letter queue (counted, not read: aio-pika could not
    decode some of them)."""
    return await queue_depth(vhost, f"{queue}.dead")


async def check_rejected_and_flowed(
    shared: Shared, vhost: RabbitVhost, db: Sql, key: str, event_type: str, hostile: int, valid: int
) -> list[dict[str, Any]]:
    """The ``valid`` events behind the ``hostile`` messages on ``shared.queues[key]`` are
    stored; each hostile one was rejected once (dead-lettered, logged, counted) and the
    source kept its connection. Returns the rejection lines."""
    queue = shared.queues[key]
    source = parse_source(source_url(vhost, queue)).name
    ids = [f"{event_type}-{n}" for n in range(valid)]
    await eventually(lambda: stored(db, event_type) == ids, timeout=30, message="the valid events are stored")
    dead: bool = await eventually(depth_is(vhost, f"{queue}.dead", hostile), timeout=30, message="dead-lettered")
    assert dead

    def rejected() -> list[dict[str, Any]]:
        lines = log_events(shared.pool, shared.ingress.process, "source.message_rejected")
        return [line for line in lines if line["source"] == source]

    await eventually(lambda: len(rejected()) == hostile, timeout=30, message="each hostile one logged")
    found = await scrape_until(
        f"{shared.ingress.url}/metrics",
        lambda f: value(f, "kenning_source_messages_total", source=source, outcome="stored") == valid,
        "the stored messages counted",
    )
    assert value(found, "kenning_source_messages_total", source=source, outcome="rejected") == hostile
    assert value(found, "kenning_source_messages_total", source=source, outcome="released") == 0
    await settled(vhost, queue)
    assert await dead_count(vhost, queue) == hostile  # once each: none came back
    assert len(rejected()) == hostile
    disconnected = log_events(shared.pool, shared.ingress.process, "source.disconnected")
    assert [line for line in disconnected if line["source"] == source] == []
    return rejected()


@pytest.mark.parametrize("kind", list(HOSTILE))
async def test_a_hostile_message_is_rejected_once_and_the_ten_behind_it_are_stored(
    db: Sql, vhost: RabbitVhost, shared: Shared, kind: str
) -> None:
    # before: the timestamps made aiormq drop the connection on every delivery of the
    # message (RabbitMQ gave it back first each time), the ce-time integer raised out of
    # the handler (never acked nor rejected) and the 20 MB event was stored
    event_type = f"t.behind.{kind}"
    await publish_raw(vhost, shared.queues[kind], hostile_message(kind), *valid_messages(event_type, 10))
    (line,) = await check_rejected_and_flowed(shared, vhost, db, kind, event_type, hostile=1, valid=10)
    error, error_type = HOSTILE[kind]
    assert error in line["error"] and line["error_type"] == error_type
    assert stored(db, f"t.hostile.{kind}") == []


async def test_more_hostile_messages_than_the_prefetch_do_not_stall_the_source(
    db: Sql, vhost: RabbitVhost, shared: Shared
) -> None:
    # before: each ce-time integer held its delivery for ever, and after 32 (the
    # prefetch) RabbitMQ sent the source nothing more
    bad = [hostile_message("ce-time-integer") for _ in range(40)]
    await publish_raw(vhost, shared.queues["stall"], *bad, *valid_messages("t.after.stall", 10))
    await check_rejected_and_flowed(shared, vhost, db, "stall", "t.after.stall", hostile=40, valid=10)
