"""``kenning ingress --source nats://...?stream=...&consumer=...``: a JetStream consumer into
the inbox, against the machine's NATS (skipped with the reason when it does not answer).

Each test has its own stream: an event in the NATS binding's binary mode (percent-encoded
``ce-`` headers) lands once and starts and wakes a workflow (a real worker), a duplicate is
stored once, an ingress killed between the inbox commit and the ack gets the message again
and stores nothing new, a malformed message is terminated (JetStream's ``MSG_TERMINATED``
advisory names it) with the error the HTTP path answers and the next one flows, a
consumer the source creates holds at most ``prefetch`` messages unacked, and payloads over
HTTP's ``--max-body-bytes`` (1, then 40) are terminated once each while the 10 events
behind them are stored.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat

from kenning_ingress.sources.addresses import parse_source
from tests.brokers import JetStreamStream, jetstream_stream, nats_connection, with_query
from tests.ingress_support import TcpProxy, cloud_event, inbox_count
from tests.metrics_support import scrape, value
from tests.sources_support import consuming, http_answer, log_events, start_consuming_ingress
from tests.support import ProcessPool, check_invariants, eventually

Sql = psycopg.Connection[tuple[object, ...]]
FORMAT = JSONFormat()
Message = tuple[dict[str, str], bytes]


def binary(event_type: str, data: Any, **attributes: Any) -> Message:
    """The event in the NATS binding's binary mode: HTTP's percent-encoded ``ce-`` headers,
    with ``datacontenttype`` as ``ce-datacontenttype``."""
    attributes.setdefault("datacontenttype", "application/json")
    message = ce_http.to_binary(cloud_event(event_type, data, **attributes), FORMAT)
    headers = {name: value for name, value in message.headers.items() if name.lower() != "content-type"}
    headers["ce-datacontenttype"] = message.headers["content-type"]
    return headers, message.body


def structured(event_type: str, data: Any, **attributes: Any) -> Message:
    message = ce_http.to_structured(cloud_event(event_type, data, **attributes), FORMAT)
    return {"Content-Type": message.headers["content-type"]}, message.body


async def publish(stream: JetStreamStream, *messages: Message) -> None:
    async with nats_connection(stream.url) as client:
        js = client.jetstream()
        for headers, body in messages:
            await js.publish(stream.subject("in"), body, headers=headers or None)


async def add_consumer(stream: JetStreamStream, name: str, **config: Any) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig

    async with nats_connection(stream.url) as client:
        await client.jetstream().add_consumer(
            stream.name, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT, **config)
        )


async def consumer_state(stream: JetStreamStream, name: str) -> Any:
    async with nats_connection(stream.url) as client:
        return await client.jetstream().consumer_info(stream.name, name)


async def settled(stream: JetStreamStream, *, redelivered: bool = False) -> bool:
    """The ``kenning`` consumer holds nothing pending or unacknowledged (and redelivered
    nothing, unless ``redelivered``). The source acks after the inbox commit, so a test
    that has seen the commit may still see the ack on its way: it waits for this."""
    state = await consumer_state(stream, "kenning")
    return bool(state.num_pending == 0 and state.num_ack_pending == 0 and (redelivered or state.num_redelivered == 0))


def source_url(stream: JetStreamStream, consumer: str, **options: str) -> str:
    return with_query(stream.url, stream=stream.name, consumer=consumer, **options)


def instance_status(sql: Sql) -> str | None:
    row = sql.execute("SELECT status FROM kenning_instances WHERE workflow_name = 'broker.order'").fetchone()
    return str(row[0]) if row else None


async def test_an_event_from_jetstream_starts_and_wakes_a_workflow_and_a_duplicate_is_stored_once(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    async with jetstream_stream() as stream:
        ingress = start_consuming_ingress(processes, database_url, source_url(stream, "kenning"))
        processes.worker(database_url, "tests.apps.brokers")
        order = binary("broker.order", {"order_id": "n-1"}, source="/shop/é", id="order n-1")  # encoded headers
        await publish(stream, order, order, structured("broker.paid", {"order_id": "n-1", "amount": 7}))

        await eventually(lambda: instance_status(sql) == "completed", timeout=30)
        rows = sql.execute("SELECT source, event_id, event_type FROM kenning_inbox ORDER BY event_type").fetchall()
        assert [(str(r[0]), str(r[1]), str(r[2])) for r in rows] == [
            ("/shop/é", "order n-1", "broker.order"),  # the duplicate stored once, decoded
            ("tests", rows[1][1], "broker.paid"),
        ]
        assert log_events(processes, ingress.process, "source.consumer_created")  # it was not there
        done: bool = await eventually(lambda: settled(stream, redelivered=True), timeout=30, message="all three acked")
        assert done
    check_invariants(sql, settled=False)  # the answer waits in the outbox: no relayer here


async def test_an_ingress_killed_after_the_inbox_commit_before_the_ack_gets_the_message_again_and_stores_it_once(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    async with jetstream_stream() as stream:
        await add_consumer(stream, "kenning", ack_wait=1.0)  # redelivered 1 s after a missing ack
        url = source_url(stream, "kenning")
        doomed = start_consuming_ingress(
            processes, database_url, url, env={"KENNING_FAULTS": "source.after_commit=crash@1"}
        )
        await publish(stream, binary("broker.crash", {"n": 1}, id="crash-1"))
        assert doomed.process.wait(timeout=30) == 137  # committed, then killed before its ack
        assert inbox_count(sql) == 1

        again = start_consuming_ingress(processes, database_url, url)
        await eventually(lambda: consuming(processes, again.process), timeout=30)

        done: bool = await eventually(lambda: settled(stream), timeout=30, message="redelivered and acked")
        assert done
        assert (await consumer_state(stream, "kenning")).delivered.stream_seq == 1
        assert inbox_count(sql) == 1  # delivered twice, stored once
        assert log_events(processes, doomed.process, "fault.fired")[0]["point"] == "source.after_commit"


CE = {"ce-specversion": "1.0", "ce-type": "t.bad"}
MALFORMED: list[tuple[dict[str, str], dict[str, str], bytes]] = [
    # (NATS headers, the same event's HTTP headers, body)
    ({**CE, "ce-source": "/s", "ce-datacontenttype": "application/json"}, {**CE, "ce-source": "/s"}, b"{}"),
    ({**CE, "ce-source": "/s", "ce-id": "j"}, {**CE, "ce-source": "/s", "ce-id": "j"}, b"{"),
    ({**CE, "ce-source": "/%zz", "ce-id": "p"}, {**CE, "ce-source": "/%zz", "ce-id": "p"}, b"{}"),
    (
        {"Content-Type": "application/cloudevents+json"},
        {"Content-Type": "application/cloudevents+json"},
        b'{"specversion": "1.0", "id": "x"}',
    ),
]


async def test_a_malformed_message_is_terminated_with_the_http_error_and_the_next_one_flows(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    async with jetstream_stream() as stream, nats_connection(stream.url) as watcher:
        await add_consumer(stream, "kenning")
        terminated: list[dict[str, Any]] = []

        async def advisory(message: Any) -> None:
            terminated.append(json.loads(message.data))

        await watcher.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream.name}.kenning", cb=advisory)
        ingress = start_consuming_ingress(processes, database_url, source_url(stream, "kenning"))
        await publish(stream, *((headers, body) for headers, _, body in MALFORMED), binary("t.good", {}, id="good"))

        await eventually(lambda: inbox_count(sql) == 1, timeout=30, message="the good message is stored")
        await eventually(lambda: len(terminated) == len(MALFORMED), timeout=30, message="every bad one terminated")
        assert sorted(a["stream_seq"] for a in terminated) == list(range(1, len(MALFORMED) + 1))
        done: bool = await eventually(lambda: settled(stream), timeout=30, message="every message acked or terminated")
        assert done

        await eventually(
            lambda: len(log_events(processes, ingress.process, "source.message_rejected")) == len(MALFORMED)
        )
        rejected = log_events(processes, ingress.process, "source.message_rejected")
        answered = [
            http_answer(ingress, {"content-type": "application/json", **headers}, body)
            for _, headers, body in MALFORMED
        ]
        assert sorted((r["error"], r["error_type"]) for r in rejected) == sorted(answered)
        assert "header ce-source holds an invalid percent-encoding" in [error for error, _ in answered]

        # the ingress's /metrics counts both outcomes, by source
        source = parse_source(source_url(stream, "kenning")).name
        found = await scrape(f"{ingress.url}/metrics")
        assert value(found, "kenning_source_messages_total", source=source, outcome="rejected") == len(MALFORMED)
        assert value(found, "kenning_source_messages_total", source=source, outcome="stored") == 1
        assert value(found, "kenning_source_settle_failures_total", source=source) == 0


async def test_a_consumer_the_source_creates_holds_at_most_prefetch_messages_unacked(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    async with jetstream_stream() as stream:
        ingress = start_consuming_ingress(processes, database_url, source_url(stream, "kenning", prefetch="3"))
        await eventually(lambda: consuming(processes, ingress.process), timeout=30)
        assert (await consumer_state(stream, "kenning")).config.max_ack_pending == 3
        with psycopg.connect(database_url) as blocker:
            blocker.execute("LOCK TABLE kenning_inbox IN SHARE ROW EXCLUSIVE MODE")  # inserts wait
            await publish(stream, *(binary("t.held", {"n": n}, id=f"held-{n}") for n in range(10)))

            async def three_held() -> bool:
                state = await consumer_state(stream, "kenning")
                return bool(state.num_ack_pending == 3 and state.num_pending == 7)

            held: bool = await eventually(three_held, timeout=30, message="3 of 10 taken")
            assert held
            for _ in range(5):  # JetStream's own count, polled: no more while those 3 wait
                assert await three_held()
            blocker.rollback()
        await eventually(lambda: inbox_count(sql) == 10, timeout=30)


async def test_a_database_outage_hands_the_messages_back_and_they_are_stored_after_it(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    async with jetstream_stream() as stream:
        await add_consumer(stream, "kenning")
        proxy = TcpProxy(database_url)  # the ingress's only way to PostgreSQL, which the test cuts
        await proxy.start()
        try:
            ingress = start_consuming_ingress(processes, proxy.url, source_url(stream, "kenning"))
            await eventually(lambda: consuming(processes, ingress.process), timeout=30)
            await proxy.stop()
            await publish(stream, *(binary("t.outage", {}, id=f"outage-{n}") for n in range(5)))

            async def handed_back() -> bool:  # -NAK: JetStream delivered some again
                return bool((await consumer_state(stream, "kenning")).num_redelivered > 0)

            await eventually(lambda: log_events(processes, ingress.process, "source.database_unavailable"), timeout=30)
            back: bool = await eventually(handed_back, timeout=30, message="nacked and redelivered")
            assert back and inbox_count(sql) == 0
            await proxy.start()
            await eventually(lambda: inbox_count(sql) == 5, timeout=30, message="stored after the outage")

            async def all_acked() -> bool:
                state = await consumer_state(stream, "kenning")
                return bool(state.num_ack_pending == 0 and state.num_pending == 0)

            acked: bool = await eventually(all_acked, timeout=30, message="all acked")
            assert acked
            assert log_events(processes, ingress.process, "source.database_back")
            source = parse_source(source_url(stream, "kenning")).name
            found = await scrape(f"{ingress.url}/metrics")
            assert value(found, "kenning_source_messages_total", source=source, outcome="released") >= 1
            assert value(found, "kenning_source_messages_total", source=source, outcome="stored") == 5
        finally:
            await proxy.stop()


# ------------------------------------------------------------------ hostile messages

MAX_BODY_BYTES = 4096  # the ingress's --max-body-bytes here (NATS itself takes 1 MB, HTTP's default)


async def check_terminated_and_flowed(
    processes: ProcessPool, database_url: str, stream: JetStreamStream, sql: Sql, hostile: int, valid: int
) -> None:
    """An ingress with ``--max-body-bytes 4096`` stores the ``valid`` events published
    after ``hostile`` oversized ones; each oversized one is terminated once (JetStream's
    advisory), logged and counted, and none is delivered again."""
    async with nats_connection(stream.url) as watcher:
        await add_consumer(stream, "kenning")
        terminated: list[dict[str, Any]] = []

        async def advisory(message: Any) -> None:
            terminated.append(json.loads(message.data))

        await watcher.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream.name}.kenning", cb=advisory)
        ingress = start_consuming_ingress(
            processes, database_url, source_url(stream, "kenning"), flags=["--max-body-bytes", str(MAX_BODY_BYTES)]
        )
        oversized = binary("t.oversized", {"pad": "x" * MAX_BODY_BYTES}, id="oversized")
        await publish(stream, *[oversized] * hostile, *(binary("t.after", {}, id=f"after-{n}") for n in range(valid)))

        await eventually(lambda: inbox_count(sql) == valid, timeout=30, message="the valid events are stored")
        await eventually(lambda: len(terminated) == hostile, timeout=30, message="each oversized one terminated")
        done: bool = await eventually(lambda: settled(stream), timeout=30, message="acked or terminated, once each")
        assert done
        assert sorted(a["stream_seq"] for a in terminated) == list(range(1, hostile + 1))
        rejected = log_events(processes, ingress.process, "source.message_rejected")
        assert [(r["error"], r["error_type"]) for r in rejected] == [
            (f"message body over {MAX_BODY_BYTES} bytes (--max-body-bytes)", "payload_too_large")
        ] * hostile
        source = parse_source(source_url(stream, "kenning")).name
        found = await scrape(f"{ingress.url}/metrics")
        assert value(found, "kenning_source_messages_total", source=source, outcome="rejected") == hostile
        assert value(found, "kenning_source_messages_total", source=source, outcome="stored") == valid
        rows = sql.execute("SELECT count(*) FROM kenning_inbox WHERE event_type = 't.oversized'").fetchone()
        assert rows is not None and rows[0] == 0


async def test_a_message_over_the_http_body_limit_is_terminated_and_the_ten_behind_it_are_stored(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    # before: the source stored it (the HTTP endpoint answers such a body 413)
    async with jetstream_stream() as stream:
        await check_terminated_and_flowed(processes, database_url, stream, sql, hostile=1, valid=10)


async def test_more_hostile_messages_than_the_prefetch_do_not_stall_the_source(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    # before: all 40 were stored
    async with jetstream_stream() as stream:
        await check_terminated_and_flowed(processes, database_url, stream, sql, hostile=40, valid=10)
