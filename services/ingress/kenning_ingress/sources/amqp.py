"""``--source amqp://...?queue=NAME``: a RabbitMQ queue into the inbox (aio-pika).

One connection and channel per ingress process; ``basic.qos(prefetch)`` bounds the
messages it holds unacknowledged, and each one is handled in its own task (aiormq starts
one per delivery), so concurrent messages share the ingress's group commit. A message is
acked after its inbox row committed; a malformed one is rejected without requeue
(``basic.reject``), which sends it to the queue's dead-letter exchange if it has one (an
``x-dead-letter-exchange`` argument or a policy; RabbitMQ adds an ``x-death`` header) and
drops it otherwise: the warning line ``source.message_rejected`` carries the error either
way. So is one whose properties aiormq could not decode (``amqp_frames``), which would
otherwise cost the connection on every delivery. While the database is away a message is
nacked with requeue after a pause.

A lost or refused connection, a channel closed by an error, a consumer RabbitMQ cancelled
(its queue was deleted) or a queue that does not exist is a warning line
(``source.disconnected``) and a new attempt every ``RECONNECT_SECONDS``; what was unacked
goes back to the queue with the connection (RabbitMQ redelivers it, marked ``redelivered``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractIncomingMessage

from kenning.hosting import amqp
from kenning.storage.inbox import NewEvent
from kenning_ingress.parsing import EventLimits, InvalidEventError
from kenning_ingress.sources import amqp_frames
from kenning_ingress.sources.addresses import AmqpSourceAddress
from kenning_ingress.sources.base import RECONNECT_SECONDS, Intake, error_text
from kenning_ingress.sources.bindings import amqp_event

_log = structlog.get_logger("kenning.ingress.source")
CONNECT_SECONDS = 10.0


class AmqpDelivery:
    def __init__(self, message: AbstractIncomingMessage) -> None:
        self.message = message

    def body_size(self) -> int:
        return len(self.message.body)

    def decode(self, limits: EventLimits) -> NewEvent:
        undecodable = amqp_frames.undecodable_reason(self.message.headers)
        if undecodable is not None:
            raise InvalidEventError(f"the message's properties cannot be decoded: {undecodable}", "invalid_encoding")
        return amqp_event(self.message.headers, self.message.content_type, self.message.body, limits)

    async def ack(self) -> None:
        await self.message.ack()

    async def reject(self, error: str, error_type: str) -> None:
        # AMQP 0-9-1 cannot add a header to a rejected message: the log line has the error
        await self.message.reject(requeue=False)

    async def release(self) -> None:
        await self.message.nack(requeue=True)

    def describe(self) -> dict[str, Any]:
        headers = self.message.headers or {}
        return {
            "delivery_tag": self.message.delivery_tag,
            "redelivered": self.message.redelivered,
            "message_id": self.message.message_id,
            "event_source": _text(headers.get("ce-source")),
            "event_id": _text(headers.get("ce-id")),
        }


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


class AmqpSource:
    def __init__(self, address: AmqpSourceAddress, intake: Intake) -> None:
        self.address = address
        self.intake = intake

    async def run(self) -> None:
        """Consume until cancelled, connecting again after every loss."""
        amqp.quiet_aiormq()  # source.disconnected says it instead
        amqp_frames.install()  # a message whose properties do not decode is rejected, not a lost connection
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker, the network or the queue: try again
                _log.warning(
                    "source.disconnected", source=self.address.name, error=error_text(exc), retry=RECONNECT_SECONDS
                )
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _consume(self) -> None:
        connection = await aio_pika.connect(
            self.address.connection_url,
            timeout=CONNECT_SECONDS,
            client_properties={"connection_name": "kenning-ingress"},
        )
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.address.prefetch)
            queue = await channel.get_queue(self.address.queue, ensure=True)  # passive: it must exist
            # Not only a lost connection ends consuming: a channel error closes the channel
            # alone, and a deleted queue makes RabbitMQ cancel the consumer (basic.cancel)
            # with both still open. Either would leave the source consuming nothing, so each
            # ends this connection and the loop in ``run`` starts again (and finds the queue).
            ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            def end(reason: str) -> None:
                if not ended.done():
                    ended.set_result(reason)

            connection.close_callbacks.add(lambda _, exc=None: end(f"the connection to RabbitMQ was closed: {exc}"))
            channel.close_callbacks.add(lambda _, exc=None: end(f"the channel was closed: {exc}"))
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(
                lambda _: end(f"RabbitMQ cancelled the consumer (queue {self.address.queue!r} deleted?)")
            )
            await queue.consume(self._received)
            _log.info(
                "source.consuming", source=self.address.name, queue=self.address.queue, prefetch=self.address.prefetch
            )
            raise ConnectionError(await ended)  # else cancelled
        finally:
            await connection.close()

    async def _received(self, message: AbstractIncomingMessage) -> None:
        await self.intake.handle(AmqpDelivery(message))
