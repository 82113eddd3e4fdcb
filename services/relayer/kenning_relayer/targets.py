"""Where the relayer publishes, chosen by the broker URL's scheme: one ``Target`` per process.

``http(s)://`` POSTs each event (``publish.py``), ``amqp(s)://`` publishes to a RabbitMQ
exchange with publisher confirms (``amqp.py``), ``nats://`` (``tls://`` over TLS) publishes
to JetStream and waits for its ack (``nats.py``). Every target answers one row with one
``OutboxOutcome`` and never raises (but on cancellation): the relayer's batch, lease,
heartbeat and outcome recording are the same whatever the protocol, and so are its
guarantees.

A broker URL is checked before the process starts (``check_url``): a bad URL, an unknown
template placeholder or a missing optional client library is one line and exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import string
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx

from kenning.core.urls import hide_credentials, split_url
from kenning.errors import ConfigurationError
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.publish import HttpTarget, RetrySchedule
from kenning_relayer.settings import RelayerSettings

HTTP_SCHEMES = ("http", "https")
AMQP_SCHEMES = ("amqp", "amqps")
NATS_SCHEMES = ("nats", "tls")  # tls://: nats-py's form for a server that requires TLS
SCHEMES = (*HTTP_SCHEMES, *AMQP_SCHEMES, *NATS_SCHEMES)
BROKER_URL = "broker URL"  # what its configuration errors call a relayer's target URL

T = TypeVar("T")

# What a routing key or subject template may name: attributes every outbox event has.
PLACEHOLDERS = ("type", "source", "subject", "id")


class Target(Protocol):
    """One broker connection (or pool) for the relayer's lifetime."""

    async def deliver(self, row: OutboxRow) -> OutboxOutcome:
        """Publish ``row`` once and decide its outcome: published only once the broker
        confirmed it; never raises except on cancellation."""
        ...

    async def close(self) -> None: ...


class Template:
    """A routing key or subject made from the event: ``events.{type}`` -> ``events.order.placed``.
    Only ``PLACEHOLDERS`` may appear, by name alone (checked at start)."""

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text)]
        except ValueError as error:
            raise ConfigurationError(f"{what} template {text!r} is invalid: {error}") from None
        for name, spec, conversion in fields:
            if name is None:
                continue
            if name not in PLACEHOLDERS or spec or conversion:
                raise ConfigurationError(
                    f"{what} template {text!r} has unknown placeholder {{{name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}}; known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )

    def render(self, row: OutboxRow) -> str:
        values = {"type": row.event_type, "source": row.source, "subject": row.subject or "", "id": row.id}
        return self.text.format_map(values)


def retrieve_exception(task: asyncio.Future[Any]) -> None:
    """A done callback: marks a task's failure as seen, so asyncio does not log it as never
    retrieved when every waiter was cancelled (the target has logged it already)."""
    if not task.cancelled():
        task.exception()


class Connecting(Generic[T]):
    """A broker target's connection attempts: one at a time, shared by every publish
    waiting for it; the next ``attempt`` after one ended (opened or failed) starts another."""

    def __init__(self, open_: Callable[[], Coroutine[Any, Any, T]], name: str) -> None:
        self._open = open_
        self._name = name
        self._task: asyncio.Task[T] | None = None

    async def attempt(self) -> T:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._open(), name=self._name)
            # every waiter may be gone (cancelled at shutdown): the failure is logged already
            self._task.add_done_callback(retrieve_exception)
        return await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """Stop an attempt under way (at close), and wait for it to end."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


def require_extra(module: str, distribution: str, extra: str, scheme: str) -> None:
    """Import ``module`` or refuse to start, naming the extra that installs it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(
            f"{scheme}:// broker URLs need the {distribution} client: pip install 'kenning[{extra}]'"
        ) from None


def check_url(url: str) -> str:
    """``url`` if the relayer can publish there; else ``ConfigurationError`` in one line."""
    if not url:
        raise ConfigurationError(
            "no broker URL: pass --broker-url or set KENNING_BROKER_URL (or --app, an App with broker_url)"
        )
    parsed = split_url(url, BROKER_URL)
    if parsed.scheme not in SCHEMES or not parsed.hostname:
        raise ConfigurationError(
            "broker URL must be http://host/... or https://host/..., amqp(s)://user:pass@host/vhost?exchange=... "
            f"or nats://host:4222?subject=... (tls:// for TLS), got {hide_credentials(url)!r}"
        )
    if parsed.scheme in AMQP_SCHEMES:
        from kenning_relayer.amqp import AmqpAddress

        AmqpAddress.parse(url)
        require_extra("aio_pika", "aio-pika", "amqp", parsed.scheme)
    elif parsed.scheme in NATS_SCHEMES:
        from kenning_relayer.nats import NatsAddress

        NatsAddress.parse(url)
        require_extra("nats", "nats-py", "nats", parsed.scheme)
    return url


def open_target(
    settings: RelayerSettings, schedule: RetrySchedule, transport: httpx.AsyncBaseTransport | None
) -> Target:
    """The target for ``settings.broker_url`` (checked by ``check_url``). It connects on
    first use, so a broker that is down at start costs attempts, not the process."""
    scheme = urlsplit(settings.broker_url).scheme
    if scheme in AMQP_SCHEMES:
        from kenning_relayer.amqp import AmqpAddress, AmqpTarget

        return AmqpTarget(AmqpAddress.parse(settings.broker_url), settings, schedule)
    if scheme in NATS_SCHEMES:
        from kenning_relayer.nats import NatsAddress, NatsTarget

        return NatsTarget(NatsAddress.parse(settings.broker_url), settings, schedule)
    return HttpTarget(settings, schedule, transport)
