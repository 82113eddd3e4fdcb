"""``--source nats://host:4222?stream=NAME&consumer=NAME``: a JetStream consumer into the
inbox (nats-py).

The consumer is a durable pull consumer with explicit acks; if it does not exist the
source creates it (every message of the stream, ``max_ack_pending`` = ``prefetch``, acks
awaited 30 s), and every ingress process pulling from it is one competing consumer. One
process holds at most ``prefetch`` messages: each is handled in a task of its own (they
share the ingress's group commit), and the next fetch asks for as many as have been
handled. A message is acked after its inbox row committed; a malformed one is terminated
(``+TERM``: never redelivered, and JetStream publishes a ``MSG_TERMINATED`` advisory naming
its stream sequence), with the warning line
``source.message_rejected`` carrying the error. While the database is away a message is
nacked after a pause, so JetStream delivers it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from kenning.storage.inbox import NewEvent
from kenning_ingress.parsing import EventLimits
from kenning_ingress.sources.addresses import NatsSourceAddress
from kenning_ingress.sources.base import RECONNECT_SECONDS, Intake, error_text
from kenning_ingress.sources.bindings import nats_event

_log = structlog.get_logger("kenning.ingress.source")
CONNECT_SECONDS = 10.0
FETCH_SECONDS = 5.0  # one long poll; an empty one just polls again
ACK_WAIT_SECONDS = 30.0  # of a consumer the source creates


class NatsDelivery:
    def __init__(self, message: Msg) -> None:
        self.message = message

    def body_size(self) -> int:
        return len(self.message.data)

    def decode(self, limits: EventLimits) -> NewEvent:
        return nats_event(self.message.headers, self.message.data, limits)

    async def ack(self) -> None:
        await self.message.ack()

    async def reject(self, error: str, error_type: str) -> None:
        await self.message.term()

    async def release(self) -> None:
        await self.message.nak()

    def describe(self) -> dict[str, Any]:
        metadata = self.message.metadata
        headers = self.message.headers or {}
        return {
            "stream_sequence": metadata.sequence.stream if metadata.sequence else None,
            "delivered": metadata.num_delivered,
            "event_source": headers.get("ce-source"),
            "event_id": headers.get("ce-id"),
        }


class NatsSource:
    def __init__(self, address: NatsSourceAddress, intake: Intake) -> None:
        self.address = address
        self.intake = intake

    async def run(self) -> None:
        """Consume until cancelled, connecting again after every loss."""
        while True:
            client: Client | None = None
            try:
                client = await nats.connect(
                    self.address.server_url,
                    name="kenning-ingress",
                    connect_timeout=CONNECT_SECONDS,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    error_cb=self._client_error,
                )
                await self._consume(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server, the network, the stream or the consumer: try again
                _log.warning(
                    "source.disconnected", source=self.address.name, error=error_text(exc), retry=RECONNECT_SECONDS
                )
            finally:
                if client is not None and not client.is_closed:
                    await client.close()
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _client_error(self, error: Exception) -> None:
        # nats-py reports lost connections here while it reconnects on its own
        _log.warning("source.broker_error", source=self.address.name, error=error_text(error))

    async def _consume(self, client: Client) -> None:
        js = client.jetstream()
        try:
            await js.consumer_info(self.address.stream, self.address.consumer)
        except NotFoundError:
            await js.add_consumer(
                self.address.stream,
                ConsumerConfig(
                    durable_name=self.address.consumer,
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    max_ack_pending=self.address.prefetch,
                    ack_wait=ACK_WAIT_SECONDS,
                ),
            )
            _log.info("source.consumer_created", source=self.address.name, consumer=self.address.consumer)
        subscription = await js.pull_subscribe_bind(durable=self.address.consumer, stream=self.address.stream)
        _log.info(
            "source.consuming",
            source=self.address.name,
            stream=self.address.stream,
            consumer=self.address.consumer,
            prefetch=self.address.prefetch,
        )
        slots = asyncio.Semaphore(self.address.prefetch)  # messages held unacked, at most prefetch
        handlers: set[asyncio.Task[None]] = set()
        try:
            while not client.is_closed:
                await slots.acquire()
                wanted = 1
                while wanted < self.address.prefetch and not slots.locked():  # every slot free now
                    await slots.acquire()
                    wanted += 1
                messages: list[Msg] = []
                with contextlib.suppress(nats.errors.TimeoutError):  # none came: ask again
                    messages = await subscription.fetch(batch=wanted, timeout=FETCH_SECONDS)
                for _ in range(wanted - len(messages)):
                    slots.release()
                for message in messages:
                    task = asyncio.create_task(self._handle(message, slots))
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)
        finally:
            for task in handlers:
                task.cancel()
        raise ConnectionError("the connection to NATS was closed")

    async def _handle(self, message: Msg, slots: asyncio.Semaphore) -> None:
        try:
            await self.intake.handle(NatsDelivery(message))
        finally:
            slots.release()
