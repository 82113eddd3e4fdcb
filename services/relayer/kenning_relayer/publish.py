"""One delivery attempt: an outbox row as a CloudEvent over HTTP, and what the answer means;
``HttpTarget`` is the relayer's target for ``http(s)://`` broker URLs (``targets.py``).

2xx: published. 408, 429, 5xx, timeouts and connection errors: retried after an
exponential back-off with jitter (tenacity's ``wait_exponential_jitter``), at least as long
as a numeric ``Retry-After`` asks, until the attempts run out (then dead letter). Any
other status: failed at once, with the response kept in ``last_error``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import tenacity
from cloudevents.core.bindings.http import HTTPMessage, to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from kenning.outbox import is_json_content_type
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.settings import ContentMode, RelayerSettings

RETRYABLE_STATUSES = frozenset({408, 429})
_FORMAT = JSONFormat()
_ERROR_BODY_LIMIT = 500


class RetrySchedule:
    """Attempt limit and back-off: ``initial * 2 ** (n - 1)`` plus up to ``initial`` of
    random jitter after failed attempt ``n``, capped at ``maximum``."""

    def __init__(self, max_attempts: int, initial_seconds: float, max_seconds: float) -> None:
        self.max_attempts = max_attempts
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self._wait = tenacity.wait_exponential_jitter(
            multiplier=initial_seconds, max=max_seconds, exp_base=2, jitter=initial_seconds
        )
        self._retrying = tenacity.AsyncRetrying()

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before the attempt after failed attempt ``attempt`` (1-based)."""
        state = tenacity.RetryCallState(retry_object=self._retrying, fn=None, args=(), kwargs={})
        state.attempt_number = attempt
        delay = float(self._wait(state))
        if retry_after is not None:
            delay = min(max(delay, retry_after), self.max_seconds)
        return delay


def failed_attempt(
    row: OutboxRow, reason: str, schedule: RetrySchedule, retry_after: float | None = None
) -> OutboxOutcome:
    """The outcome of a failed attempt that may succeed later, on every target: retried
    after the back-off, or dead-lettered with ``reason`` once the attempts are spent."""
    if row.attempts >= schedule.max_attempts:
        return OutboxOutcome(row.id, "failed", f"gave up after {row.attempts} attempts; last error: {reason}")
    return OutboxOutcome(row.id, "pending", reason, schedule.delay(row.attempts, retry_after))


def error_text(error: BaseException) -> str:
    """``ClassName: message`` (just the class when the message is empty)."""
    return f"{type(error).__name__}: {error}".rstrip(": ")


def to_cloudevent(row: OutboxRow, mode: ContentMode) -> CloudEvent:
    """The CloudEvent of an outbox row; ``id`` is the row id and ``time`` its creation
    time, both the same on every attempt."""
    attributes: dict[str, Any] = {
        "id": row.id,
        "source": row.source,
        "type": row.event_type,
        "specversion": "1.0",
        "time": row.created_at,
    }
    if row.subject is not None:
        attributes["subject"] = row.subject
    if row.content_type is not None:
        attributes["datacontenttype"] = row.content_type
    for name, value in row.extensions.items():
        # Header values are strings; a Boolean's canonical string form is true/false.
        attributes[name] = ("true" if value else "false") if mode == "binary" and isinstance(value, bool) else value
    data: Any
    if row.data_bytes is not None:
        data = row.data_bytes
    elif row.data is None:
        data = None
    elif is_json_content_type(row.content_type):
        # Binary mode: the body is written here, not by the SDK, so JSON arrays and
        # scalars survive; structured mode embeds the JSON value as it is.
        data = json.dumps(row.data).encode() if mode == "binary" else row.data
    else:
        text = row.data if isinstance(row.data, str) else json.dumps(row.data)
        data = text.encode() if mode == "binary" else text
    return CloudEvent(attributes, data)


def to_http(row: OutboxRow, mode: ContentMode) -> HTTPMessage:
    event = to_cloudevent(row, mode)
    return to_binary(event, _FORMAT) if mode == "binary" else to_structured(event, _FORMAT)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP-date: the back-off alone decides
    return seconds if seconds >= 0 else None


def _response_error(response: httpx.Response) -> str:
    body = response.text[:_ERROR_BODY_LIMIT].strip()
    summary = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    return f"{summary}: {body}" if body else summary


async def deliver(
    client: httpx.AsyncClient, url: str, row: OutboxRow, mode: ContentMode, schedule: RetrySchedule
) -> OutboxOutcome:
    """POST ``row`` once and decide its outcome; never raises except on cancellation."""
    try:
        message = to_http(row, mode)
    except Exception as error:  # a row the SDK rejects can never be sent
        return OutboxOutcome(row.id, "failed", f"invalid CloudEvent: {error}")
    retry_after: float | None = None
    try:
        response = await client.post(url, headers=message.headers, content=message.body)
    except httpx.TimeoutException as error:
        reason = f"timeout ({type(error).__name__}) after {client.timeout.read} s"
    except httpx.HTTPError as error:
        reason = error_text(error)
    else:
        status = response.status_code
        if 200 <= status < 300:
            return OutboxOutcome(row.id, "published")
        reason = _response_error(response)
        if status not in RETRYABLE_STATUSES and status < 500:
            return OutboxOutcome(row.id, "failed", f"rejected: {reason}")
        retry_after = _retry_after(response)
    return failed_attempt(row, reason, schedule, retry_after)


class HttpTarget:
    """POSTs each event to the broker URL over one pooled httpx client."""

    def __init__(
        self, settings: RelayerSettings, schedule: RetrySchedule, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.url = settings.broker_url
        self.mode = settings.content_mode
        self.schedule = schedule
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.request_timeout_seconds, pool=None),
            limits=httpx.Limits(
                max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
            ),
            transport=transport,
        )

    async def deliver(self, row: OutboxRow) -> OutboxOutcome:
        return await deliver(self.client, self.url, row, self.mode, self.schedule)

    async def close(self) -> None:
        await self.client.aclose()
