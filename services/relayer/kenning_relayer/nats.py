"""The relayer's NATS JetStream target: ``nats://host:4222?subject=...`` (``tls://`` over TLS).

Each event is a JetStream publish on a subject made from the event (``subject=``, default
``{type}``) with ``Nats-Msg-Id`` set to the CloudEvent id; the row is published only once
the stream's ``PubAck`` came back. A re-send of the same event (a relayer killed after the
ack, before the row was marked) carries the same ``Nats-Msg-Id``, and the stream drops it
if it arrives within its duplicate window (``PubAck.duplicate``). ``stream=NAME`` makes the
server refuse a subject that some other stream holds (``Nats-Expected-Stream``).

The message is the CloudEvent in the NATS protocol binding (1.0.3, 3.1.3): binary mode
puts every attribute, ``datacontenttype`` included, in a ``ce-`` header whose value is
percent-encoded as the HTTP binding's are (space, ``"``, ``%`` and all but printable
ASCII), the data in the payload; structured mode sends the JSON event format with
``content-type: application/cloudevents+json``.

One client serves every publish. It is opened on first use and opened again once it is
closed (nats-py's own reconnect is off, so a publish never sits in a buffer that is
flushed after its attempt was given up), and a broker that is down costs attempts with
back-off, never the process.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

import structlog
from cloudevents.core.bindings import http
from cloudevents.core.formats.json import JSONFormat

from kenning.core.urls import hide_credentials, query_options, split_url
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.publish import RetrySchedule, error_text, failed_attempt, to_cloudevent
from kenning_relayer.settings import ContentMode, RelayerSettings
from kenning_relayer.targets import BROKER_URL, Connecting, Template

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

_FORMAT = JSONFormat()
_OPTIONS = ("subject", "stream")
MSG_ID_HEADER = "Nats-Msg-Id"
# what a ce- header value keeps as it is (the binding's 3.1.3.2): printable ASCII but space, '"' and '%'
_CE_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+")  # NATS subject tokens when publishing: no wildcards


@dataclass(frozen=True)
class NatsAddress:
    server: str  # nats://[user:pass@]host:port
    subject: Template
    stream: str | None  # the stream the subject must land in, if named
    display: str

    @classmethod
    def parse(cls, url: str) -> NatsAddress:
        parsed = split_url(url, BROKER_URL)
        options = query_options(url, _OPTIONS, BROKER_URL)
        return cls(
            server=parsed._replace(path="", query="", fragment="").geturl(),
            subject=Template(options.get("subject", "{type}"), "subject"),
            stream=options.get("stream") or None,
            display=hide_credentials(url),
        )


def valid_subject(subject: str) -> bool:
    return all(_SUBJECT_TOKEN.fullmatch(token) for token in subject.split("."))


def to_nats_message(row: OutboxRow, mode: ContentMode) -> tuple[dict[str, str], bytes]:
    """Headers and payload of ``row`` in the NATS binding. Its binary mode is the HTTP
    binding's but for ``datacontenttype``, which is a ``ce-`` header too (HTTP's
    ``Content-Type`` would make a binary event whose data is ``application/cloudevents+json``
    read as structured), so that binding's encoder is reused and that one header moved."""
    event = to_cloudevent(row, mode)
    if mode == "binary":
        message = http.to_binary(event, _FORMAT)
        headers = {name: value for name, value in message.headers.items() if name != "content-type"}
        if "content-type" in message.headers:
            headers["ce-datacontenttype"] = quote(message.headers["content-type"], safe=_CE_SAFE)
    else:
        message = http.to_structured(event, _FORMAT)
        headers = dict(message.headers)
    headers[MSG_ID_HEADER] = row.id
    return headers, message.body


class NatsTarget:
    def __init__(self, address: NatsAddress, settings: RelayerSettings, schedule: RetrySchedule) -> None:
        self.address = address
        self.mode = settings.content_mode
        self.schedule = schedule
        self.timeout = settings.request_timeout_seconds
        self.log = structlog.get_logger("kenning.relayer").bind(broker_url=address.display)
        self._client: Client | None = None
        self._jetstream: JetStreamContext | None = None
        self._connecting = Connecting(self._open, "kenning-nats-connect")

    async def deliver(self, row: OutboxRow) -> OutboxOutcome:
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeoutError
        from nats.js.errors import NoStreamResponseError

        try:
            headers, payload = to_nats_message(row, self.mode)
        except Exception as error:  # a row the SDK rejects can never be sent
            return OutboxOutcome(row.id, "failed", f"invalid CloudEvent: {error}")
        subject = self.address.subject.render(row)
        if not valid_subject(subject):
            return OutboxOutcome(row.id, "failed", f"invalid NATS subject {subject!r}")
        try:
            jetstream = await self._ready()
        except Exception as error:
            return failed_attempt(row, f"broker unreachable: {error_text(error)}", self.schedule)
        try:
            ack = await jetstream.publish(
                subject, payload, timeout=self.timeout, stream=self.address.stream, headers=headers
            )
        except (NoRespondersError, NoStreamResponseError):
            reason = f"no JetStream stream holds subject {subject!r} (no responders)"
        except NatsTimeoutError:
            reason = f"no JetStream ack within {self.timeout} s"
        except Exception as error:  # an APIError carries the server's code and description
            reason = error_text(error)
        else:
            if ack.duplicate:
                self.log.info("relayer.duplicate_dropped", event_id=row.id, stream=ack.stream, seq=ack.seq)
            return OutboxOutcome(row.id, "published")
        return failed_attempt(row, reason, self.schedule)

    async def _ready(self) -> JetStreamContext:
        """The JetStream context of an open client; one connection attempt at a time, shared
        by every publish waiting for it."""
        client, jetstream = self._client, self._jetstream
        if client is not None and jetstream is not None:
            if client.is_connected:
                return jetstream
            self.log.warning("relayer.broker_connection_lost")
            self._jetstream = None
        return await self._connecting.attempt()

    async def _error(self, error: Exception) -> None:
        # nats-py's default logs at error level with a traceback; a lost broker is retried.
        # While connecting, relayer.broker_unreachable says it once.
        if self._client is not None:
            self.log.warning("relayer.broker_error", error=error_text(error))

    async def _open(self) -> JetStreamContext:
        import nats

        await self._discard()
        try:
            client = await nats.connect(
                self.address.server,
                connect_timeout=max(1, round(self.timeout)),
                allow_reconnect=False,
                # two quick tries, then NoServersError (0 would mean forever); the back-off is the row's
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=self._error,
                name="kenning-relayer",
            )
        except Exception as error:
            self.log.warning("relayer.broker_unreachable", error=error_text(error))
            raise
        jetstream = client.jetstream(timeout=self.timeout)
        self._client, self._jetstream = client, jetstream
        self.log.info("relayer.broker_connected")
        return jetstream

    async def _discard(self) -> None:
        client, self._client, self._jetstream = self._client, None, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await client.close()

    async def close(self) -> None:
        await self._connecting.cancel()
        await self._discard()
