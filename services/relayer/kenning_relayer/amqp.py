"""The relayer's AMQP 0-9-1 target (RabbitMQ): ``amqp://user:pass@host:5672/vhost?exchange=...``.

Each event is published to the exchange (the default exchange when none is named) with a
routing key made from the event (``routing_key=``, default ``{type}``), persistent, and
``mandatory``, on a channel with publisher confirms: the row is published only once the
broker acked it, and a message no queue takes comes back as an error (``Basic.Return``),
retried and at last dead-lettered with the broker's answer, never dropped unseen.

The message is the CloudEvent in the RabbitMQ protocol binding (the CloudEvents SDK's
``cloudevents.core.bindings.rabbitmq``): binary mode puts the attributes in ``ce-``
headers and ``datacontenttype`` in the ``content_type`` property; structured mode sends
the JSON event format with ``content_type: application/cloudevents+json``. The AMQP
``message_id`` is the event id, so consumers can deduplicate a re-send by (source, id).

One connection and one channel serve every publish; they are opened on first use and
again after they are lost (a broker restart, a network cut), so a broker that is down
costs attempts with back-off, never the process.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from cloudevents.core.bindings import rabbitmq
from cloudevents.core.formats.json import JSONFormat

from kenning.core.urls import hide_credentials, query_options, split_url
from kenning.hosting import amqp
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.publish import RetrySchedule, error_text, failed_attempt, to_cloudevent
from kenning_relayer.settings import ContentMode, RelayerSettings
from kenning_relayer.targets import BROKER_URL, Connecting, Template

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

_FORMAT = JSONFormat()
_ROUTING_KEY_LIMIT = 255  # bytes: AMQP 0-9-1's shortstr
# The relayer's own options; amqp.CONNECTION_OPTIONS are passed on to aio-pika's connect.
_OPTIONS = ("exchange", "routing_key")


class BrokerRefusedError(Exception):
    """The broker answered the connection but refused the channel or the exchange."""


@dataclass(frozen=True)
class AmqpAddress:
    connect_url: str  # the broker URL without the relayer's own options
    exchange: str  # "": the default exchange (the routing key names the queue)
    routing_key: Template
    display: str  # the URL with its password hidden
    vhost: str

    @classmethod
    def parse(cls, url: str) -> AmqpAddress:
        parsed = split_url(url, BROKER_URL)
        options = query_options(url, (*_OPTIONS, *amqp.CONNECTION_OPTIONS), BROKER_URL)
        return cls(
            connect_url=amqp.connection_url(parsed, options),
            exchange=options.get("exchange", ""),
            routing_key=Template(options.get("routing_key", "{type}"), "routing_key"),
            display=hide_credentials(url),
            vhost=amqp.vhost_of(parsed),
        )


def to_message_parts(row: OutboxRow, mode: ContentMode) -> rabbitmq.RabbitMQMessage:
    event = to_cloudevent(row, mode)
    if mode == "binary":
        return rabbitmq.to_binary(event, _FORMAT)
    return rabbitmq.to_structured(event, _FORMAT)


class AmqpTarget:
    def __init__(self, address: AmqpAddress, settings: RelayerSettings, schedule: RetrySchedule) -> None:
        self.address = address
        self.mode = settings.content_mode
        self.schedule = schedule
        self.timeout = settings.request_timeout_seconds
        self.log = structlog.get_logger("kenning.relayer").bind(broker_url=address.display)
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._connecting = Connecting(self._open, "kenning-amqp-connect")
        amqp.quiet_aiormq()  # relayer.broker_unreachable and broker_connection_lost say it instead

    async def deliver(self, row: OutboxRow) -> OutboxOutcome:
        import aio_pika
        from aiormq.exceptions import DeliveryError, PublishError

        try:
            parts = to_message_parts(row, self.mode)
        except Exception as error:  # a row the SDK rejects can never be sent
            return OutboxOutcome(row.id, "failed", f"invalid CloudEvent: {error}")
        routing_key = self.address.routing_key.render(row)
        if len(routing_key.encode()) > _ROUTING_KEY_LIMIT:
            too_long = f"routing key longer than {_ROUTING_KEY_LIMIT} bytes: {routing_key!r}"
            return OutboxOutcome(row.id, "failed", too_long)
        message = aio_pika.Message(
            parts.body,
            headers=dict(parts.headers),
            content_type=parts.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=row.id,
        )
        try:
            exchange = await self._ready()
        except BrokerRefusedError as error:
            return failed_attempt(row, f"broker refused: {error}", self.schedule)
        except Exception as error:
            return failed_attempt(row, f"broker unreachable: {error_text(error)}", self.schedule)
        try:
            await exchange.publish(message, routing_key, mandatory=True, timeout=self.timeout)
        except PublishError as error:  # Basic.Return: no queue is bound for this key
            returned = error.message.delivery if error.message is not None else None
            reason = (
                f"unroutable: {getattr(returned, 'reply_code', '?')} {getattr(returned, 'reply_text', '')} "
                f"(exchange {self.address.exchange!r}, routing key {routing_key!r})"
            )
        except DeliveryError as error:  # Basic.Nack: the broker did not take it
            reason = f"rejected by the broker: {error}"
        except TimeoutError:
            reason = f"no confirm from the broker within {self.timeout} s"
        except Exception as error:  # the channel or connection closed under the publish
            reason = error_text(error)
        else:
            return OutboxOutcome(row.id, "published")
        return failed_attempt(row, reason, self.schedule)

    async def _ready(self) -> AbstractExchange:
        """The exchange on an open channel; one connection attempt at a time, shared by
        every publish waiting for it."""
        exchange, channel, connection = self._exchange, self._channel, self._connection
        if exchange is not None and channel is not None and connection is not None:
            if not connection.is_closed and not channel.is_closed:
                return exchange
            self._exchange = None
        return await self._connecting.attempt()

    async def _open(self) -> AbstractExchange:
        import aio_pika

        await self._discard()
        try:
            connection = await aio_pika.connect(self.address.connect_url, timeout=self.timeout)
        except Exception as error:
            # warning, not error: the rows are retried with back-off, as over HTTP
            self.log.warning("relayer.broker_unreachable", error=error_text(error))
            raise
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            if self.address.exchange:
                # passive: the exchange is the operator's, made with the type and bindings they chose
                exchange = await channel.get_exchange(self.address.exchange, ensure=True)
            else:
                exchange = channel.default_exchange
        except Exception as error:
            self.log.warning("relayer.broker_refused", error=error_text(error), exchange=self.address.exchange)
            with contextlib.suppress(Exception):
                await connection.close()
            raise BrokerRefusedError(error_text(error)) from error
        self._connection, self._channel, self._exchange = connection, channel, exchange
        connection.close_callbacks.add(self._connection_closed)
        self.log.info("relayer.broker_connected", vhost=self.address.vhost, exchange=self.address.exchange)
        return exchange

    def _connection_closed(self, connection: object, error: BaseException | None = None) -> None:
        if connection is self._connection:  # not one the relayer closed itself
            reason = error_text(error) if error is not None else "closed"
            self.log.warning("relayer.broker_connection_lost", vhost=self.address.vhost, error=reason)

    async def _discard(self) -> None:
        connection, self._connection, self._channel, self._exchange = self._connection, None, None, None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        await self._connecting.cancel()
        await self._discard()
