"""Both directions through real brokers at once: a workflow started and woken by events
arriving by AMQP (RabbitMQ, ``kenning ingress --source``) answers with an outbox event the
relayer publishes to NATS JetStream (``kenning relayer --broker-url nats://...``), which the
test reads back from the stream. Real ingress, worker and relayer processes, real servers
(skipped with the reason where one does not answer)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from cloudevents.core.bindings import rabbitmq
from cloudevents.core.formats.json import JSONFormat

from kenning.storage.inbox import NewEvent
from kenning_ingress.sources.bindings import nats_event
from tests.apps.brokers import ANSWER_TYPE
from tests.brokers import (
    RabbitVhost,
    amqp_channel,
    jetstream_stream,
    rabbitmq_vhost,
    require_nats,
    stream_messages,
    with_query,
)
from tests.ingress_support import cloud_event
from tests.relayer_support import relayer_process
from tests.sources_support import start_consuming_ingress
from tests.support import ProcessPool, check_invariants, eventually

Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def vhost(processes: ProcessPool) -> Iterator[RabbitVhost]:
    """Deleted after the processes stopped (a vhost deleted under them closes their connections)."""
    require_nats()  # before the vhost is made: skip at once when either server is absent
    with rabbitmq_vhost("kenning-mixed") as made:
        yield made


async def test_a_workflow_woken_by_amqp_answers_through_the_outbox_to_jetstream(
    processes: ProcessPool, database_url: str, sql: Sql, vhost: RabbitVhost
) -> None:
    import aio_pika

    queue = f"orders-{uuid.uuid4().hex[:8]}"
    async with amqp_channel(vhost.url) as channel:
        await channel.declare_queue(queue, durable=True)
    async with jetstream_stream() as stream:
        start_consuming_ingress(processes, database_url, with_query(vhost.url, queue=queue))
        # each step's commit stalls the worker a second: the relayer publishes the answer while
        # the instance is still running, every time (as a slow CI machine did once)
        processes.worker(database_url, "tests.apps.brokers", env={"KENNING_FAULTS": "step.after_commit=stall:1"})
        relayer_process(processes, database_url, stream.relayer_url(subject=f"{stream.prefix}.{{type}}"))

        async with amqp_channel(vhost.url) as channel:
            for sent in (
                cloud_event("broker.order", {"order_id": "m-1"}, source="/shop", id="order-m-1"),
                cloud_event("broker.paid", {"order_id": "m-1", "amount": 99}, source="/payments", id="paid-m-1"),
            ):
                message = rabbitmq.to_binary(sent, JSONFormat())
                await channel.default_exchange.publish(
                    aio_pika.Message(message.body, headers=dict(message.headers), content_type=message.content_type),
                    routing_key=queue,
                )

        async def answered() -> list[Any]:
            return await stream_messages(stream)

        published: list[Any] = await eventually(answered, timeout=30, message="the answer on JetStream")
        (answer,) = published
        assert answer.subject == f"{stream.prefix}.{ANSWER_TYPE}"
        event: NewEvent = nats_event(answer.headers, answer.data)  # read back as the ingress's NATS source reads it
        assert (event.event_type, event.data) == (ANSWER_TYPE, {"order_id": "m-1", "amount": 99})
        # the answer's outbox row commits with its step; the instance completes in a later
        # transaction, so the relayer may publish the answer before the instance is done
        row = await eventually(
            lambda: sql.execute("SELECT status, result FROM kenning_instances WHERE status = 'completed'").fetchone(),
            timeout=30,
            message="the instance completed",
        )
        assert row is not None
        result = row[1]
        assert isinstance(result, dict)
        assert result["result"]["answer_id"] == event.event_id == answer.headers["Nats-Msg-Id"]
        assert result["result"]["paid_via"] == "/payments"
        await eventually(
            lambda: sql.execute("SELECT count(*) FROM kenning_outbox WHERE status = 'published'").fetchone() == (1,)
        )
    check_invariants(sql)
