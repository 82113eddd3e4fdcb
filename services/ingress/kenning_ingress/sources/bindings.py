"""CloudEvents protocol bindings for the broker sources: a message's headers, content type
and body to one event, checked by the HTTP path's own rules (``kenning_ingress.parsing``),
so a malformed message gets the error text a request gets.

RabbitMQ (AMQP 0-9-1, the binding of ``cloudevents.core.bindings.rabbitmq``): attributes in
``ce-`` headers as plain AMQP values (strings; an extension may be an integer or boolean;
``time`` may be an AMQP timestamp), ``datacontenttype`` in the ``content_type`` property,
data in the body; structured mode when ``content_type`` is ``application/cloudevents+json``.
The AMQP 1.0 binding's ``cloudEvents_`` and ``cloudEvents:`` prefixes are read too (what a
bridge from an AMQP 1.0 broker carries over).

NATS (the NATS protocol binding 1.0.3): structured mode when the ``Content-Type`` header is
``application/cloudevents+json``, and when a message has no ``ce-`` header at all (the
binding before NATS had headers was structured only); otherwise binary, attributes in
``ce-`` headers percent-encoded as HTTP's are, ``datacontenttype`` in ``ce-datacontenttype``.

Neither binding defines a batch: one message is one event.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

from kenning.storage.inbox import NewEvent
from kenning_ingress.parsing import (
    DEFAULT_LIMITS,
    STRUCTURED,
    EventLimits,
    InvalidEventError,
    binary_event,
    decode_header,
    media_type,
    structured_event,
)

AMQP_PREFIXES = ("ce-", "cloudevents_", "cloudevents:")  # compared lower-cased
NATS_PREFIX = "ce-"


def _invalid(message: str, error_type: str) -> NoReturn:
    raise InvalidEventError(message, error_type)


def _not_a_cloudevent(media: str) -> NoReturn:
    _invalid(
        f"not a CloudEvent: content type {media or 'none'!r} without ce- headers; send binary mode "
        f"(ce-* headers) or {STRUCTURED}",
        "unsupported_content_type",
    )


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:  # AMQP timestamps are UTC seconds
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _amqp_value(header: str, attribute: str, value: Any) -> Any:
    """An AMQP header value as the attribute's value (the checks after are HTTP's)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            _invalid(f"header {header} is not valid UTF-8", "invalid_encoding")
    if isinstance(value, datetime):
        return _rfc3339(value)
    if attribute == "time" and isinstance(value, int) and not isinstance(value, bool):
        # the AMQP 1.0 binding's timestamp: milliseconds since the epoch
        try:
            return _rfc3339(datetime.fromtimestamp(value / 1000, tz=UTC))
        except (ValueError, OverflowError, OSError):  # past year 9999, or before year 1
            _invalid(
                f"header {header} holds {value} milliseconds since the epoch, outside the years 1 to 9999",
                "invalid_attribute",
            )
    if isinstance(value, str | bool | int):
        return value
    _invalid(
        f"header {header} holds a {type(value).__name__}; attributes are strings, integers or booleans",
        "invalid_attribute",
    )


def amqp_event(
    headers: Mapping[str, Any] | None, content_type: str | None, body: bytes, limits: EventLimits = DEFAULT_LIMITS
) -> NewEvent:
    """The event of a RabbitMQ message; raises ``InvalidEventError``."""
    media = media_type(content_type)
    if media.startswith("application/cloudevents"):
        return structured_event(media, body, limits)
    attributes: dict[str, Any] = {}
    for header, value in (headers or {}).items():
        lowered = header.lower()
        prefix = next((p for p in AMQP_PREFIXES if lowered.startswith(p)), None)
        if prefix is None:
            continue
        attribute = lowered[len(prefix) :]
        if attribute in attributes:
            _invalid(f"attribute {attribute!r} is given more than once (header {header})", "invalid_attribute")
        attributes[attribute] = _amqp_value(header, attribute, value)
    if not attributes:
        _not_a_cloudevent(media)
    return binary_event(attributes, content_type, body, limits)


def nats_event(headers: Mapping[str, str] | None, body: bytes, limits: EventLimits = DEFAULT_LIMITS) -> NewEvent:
    """The event of a NATS (JetStream) message; raises ``InvalidEventError``."""
    lowered = {name.lower(): value for name, value in (headers or {}).items()}
    content_type = lowered.get("content-type")
    media = media_type(content_type)
    ce_headers = {
        name[len(NATS_PREFIX) :]: value.encode("utf-8")
        for name, value in lowered.items()
        if name.startswith(NATS_PREFIX)
    }
    if media.startswith("application/cloudevents") or (not ce_headers and not media):
        return structured_event(media or STRUCTURED, body, limits)
    if not ce_headers:
        _not_a_cloudevent(media)
    encoded_type = ce_headers.pop("datacontenttype", None)
    # the binding's place for it is ce-datacontenttype; a Content-Type header is taken too
    data_type = decode_header("datacontenttype", encoded_type, limits) if encoded_type is not None else content_type
    attributes: dict[str, Any] = {name: decode_header(name, raw, limits) for name, raw in ce_headers.items()}
    return binary_event(attributes, data_type, body, limits)
