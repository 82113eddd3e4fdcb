"""Where a source consumes, as its ``--source`` URL says; checked before the ingress starts.

``amqp(s)://user:pass@host:5672/vhost?queue=NAME[&prefetch=N]`` consumes a RabbitMQ queue
(the vhost percent-encoded, ``%2F`` or nothing for ``/``; aio-pika's ``heartbeat`` and TLS
options pass through). ``nats://[user:pass@]host:4222
?stream=NAME&consumer=NAME[&prefetch=N]`` pulls from a JetStream durable consumer (created,
pull and explicit-ack, if it does not exist). ``prefetch`` bounds the messages one ingress
process holds unacknowledged (AMQP ``basic.qos``, JetStream's fetch batch and, for a
consumer the source creates, its ``max_ack_pending``).

No broker library is imported here: a URL is checked (one line, exit code 2) whether or
not its extra is installed, and ``require_client`` names the extra that is missing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from kenning.core.urls import hide_credentials, query_options, split_url
from kenning.errors import ConfigurationError
from kenning.hosting import amqp

AMQP_SCHEMES = ("amqp", "amqps")
NATS_SCHEMES = ("nats", "tls")
DEFAULT_PREFETCH = 32
MAX_PREFETCH = 65535  # basic.qos's prefetch-count is 16 bits
FORMS = "amqp(s)://user:pass@host/vhost?queue=NAME or nats://host:4222?stream=NAME&consumer=NAME"


def _required(url: str, options: dict[str, str], name: str) -> str:
    value = options.get(name, "")
    if not value:
        raise ConfigurationError(f"source {hide_credentials(url)!r} needs ?{name}=NAME ({FORMS})")
    return value


def _prefetch(url: str, options: dict[str, str]) -> int:
    text = options.get("prefetch", str(DEFAULT_PREFETCH))
    if not text.isdigit() or not 1 <= int(text) <= MAX_PREFETCH:
        raise ConfigurationError(
            f"source {hide_credentials(url)!r}: prefetch={text!r} must be a whole number from 1 to {MAX_PREFETCH}"
        )
    return int(text)


@dataclass(frozen=True)
class AmqpSourceAddress:
    url: str  # as given (logs use ``name``)
    connection_url: str  # without the source's own options, for aio-pika
    vhost: str
    queue: str
    prefetch: int

    @property
    def name(self) -> str:
        return hide_credentials(self.url)

    @classmethod
    def parse(cls, url: str) -> AmqpSourceAddress:
        options = query_options(url, ("queue", "prefetch", *amqp.CONNECTION_OPTIONS), "source")
        parsed = urlsplit(url)
        return cls(
            url=url,
            connection_url=amqp.connection_url(parsed, options),
            vhost=amqp.vhost_of(parsed),
            queue=_required(url, options, "queue"),
            prefetch=_prefetch(url, options),
        )


@dataclass(frozen=True)
class NatsSourceAddress:
    url: str
    server_url: str  # without the source's own options, for nats-py
    stream: str
    consumer: str
    prefetch: int

    @property
    def name(self) -> str:
        return hide_credentials(self.url)

    @classmethod
    def parse(cls, url: str) -> NatsSourceAddress:
        options = query_options(url, ("stream", "consumer", "prefetch"), "source")
        parsed = urlsplit(url)
        if parsed.path not in ("", "/"):
            raise ConfigurationError(f"source {hide_credentials(url)!r}: a nats:// URL has no path ({FORMS})")
        return cls(
            url=url,
            server_url=urlunsplit(parsed._replace(path="", query="", fragment="")),
            stream=_required(url, options, "stream"),
            consumer=_required(url, options, "consumer"),
            prefetch=_prefetch(url, options),
        )


SourceAddress = AmqpSourceAddress | NatsSourceAddress


def parse_source(url: str) -> SourceAddress:
    """The source ``url`` names; ``ConfigurationError`` (one line) if it names none."""
    parsed = split_url(url, "source")
    if parsed.scheme in AMQP_SCHEMES and parsed.hostname:
        return AmqpSourceAddress.parse(url)
    if parsed.scheme in NATS_SCHEMES and parsed.hostname:
        return NatsSourceAddress.parse(url)
    raise ConfigurationError(f"a source must be {FORMS}, got {hide_credentials(url)!r}")


def require_client(address: SourceAddress) -> None:
    """Import the source's broker client or refuse to start, naming the extra that installs it."""
    module, extra, scheme = (
        ("aio_pika", "amqp", "amqp") if isinstance(address, AmqpSourceAddress) else ("nats", "nats", "nats")
    )
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(
            f"a {scheme}:// source needs the {module.replace('_', '-')} client: pip install 'kenning[{extra}]'"
        ) from None
