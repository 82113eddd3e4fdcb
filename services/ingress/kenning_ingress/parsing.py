"""CloudEvents 1.0 over HTTP: binary, structured and batched content modes.

Stricter than the ``cloudevents`` SDK's own HTTP parsing where PostgreSQL or the HTTP
binding demand it: header values must be valid percent-encoded UTF-8 (the SDK lets
``%C0%A0`` through), JSON must parse (the SDK falls back to a string), and text must hold
no NUL and JSON no ``\\u0000``, lone surrogate or non-finite number, which PostgreSQL
cannot store. Every event then passes the SDK's own validation (``CloudEvent(...)``).

Sizes are capped (``EventLimits``) before anything is stored: attribute names, values,
the number of extensions, ``id``/``source`` (and the instance id) each have a limit, and
a request over one gets a 400 ``limit_exceeded`` naming it and the flag that sets it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn
from urllib.parse import unquote_to_bytes

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent

from kenning import serialization
from kenning.core.limits import MAX_ID_LENGTH
from kenning.events import INSTANCE_EXTENSION, reserved_attribute_error
from kenning.storage.inbox import NewEvent

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
REQUIRED = ("id", "source", "type", "specversion")
OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
_JSON_MEDIA = re.compile(r"^(application|text)/([a-z0-9\-.]+\+)?json$")
_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# CloudEvents integers are signed 32-bit (the spec's Integer type)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# attributes whose length is an identifier's, not a value's
_IDENTIFIERS = ("id", "source", INSTANCE_EXTENSION)


@dataclass(frozen=True)
class EventLimits:
    """How large one event's attributes may be (``kenning ingress --ingress-max-*``)."""

    max_attribute_length: int = 4096  # characters in any attribute value
    max_attribute_name_length: int = 20  # the CloudEvents spec's own recommendation
    max_extensions: int = 64
    max_id_length: int = MAX_ID_LENGTH  # id, source and kenninginstanceid


DEFAULT_LIMITS = EventLimits()


class InvalidEventError(Exception):
    """The request is not a valid CloudEvent; nothing is stored (HTTP 400)."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


def _invalid(message: str, error_type: str) -> NoReturn:
    raise InvalidEventError(message, error_type)


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json_media(media: str) -> bool:
    return bool(_JSON_MEDIA.match(media))


def parse_request(
    headers: Sequence[tuple[bytes, bytes]], body: bytes, limits: EventLimits = DEFAULT_LIMITS
) -> tuple[list[NewEvent], bool]:
    """The events of one request and whether it was a batch; raises ``InvalidEventError``."""
    content_type: str | None = None
    ce_headers: dict[str, bytes] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name == "content-type":
            content_type = raw_value.decode("latin-1")
        elif name.startswith("ce-"):
            attribute = name[3:]
            if attribute in ce_headers:
                _invalid(f"header {name} is given more than once", "invalid_attribute")
            ce_headers[attribute] = raw_value
            # counted while reading, so 100,000 headers are refused before any is decoded
            if len(ce_headers) > len(REQUIRED) + len(OPTIONAL) + limits.max_extensions:
                _over_extensions(limits)
    media = media_type(content_type)
    if media.startswith("application/cloudevents-batch"):
        if media != BATCH:
            _invalid(f"unsupported batch format {media!r}: only {BATCH} is accepted", "unsupported_content_type")
        return _parse_batch(body, limits), True
    if media.startswith("application/cloudevents"):
        return [structured_event(media, body, limits)], False
    if ce_headers:
        return [_parse_binary(ce_headers, content_type, body, limits)], False
    _invalid(
        f"not a CloudEvent: content type {media or 'none'!r} without ce- headers; send binary mode "
        f"(ce-* headers), {STRUCTURED} or {BATCH}",
        "unsupported_content_type",
    )


def structured_event(media: str, body: bytes, limits: EventLimits = DEFAULT_LIMITS) -> NewEvent:
    """One event in structured mode (``media``: the message's media type, lower case):
    HTTP's, and the broker sources' (``kenning_ingress.sources``)."""
    if media != STRUCTURED:
        _invalid(f"unsupported event format {media!r}: only {STRUCTURED} is accepted", "unsupported_content_type")
    document = load_json(body, "the body")
    if not isinstance(document, dict):
        _invalid("a structured CloudEvent must be a JSON object", "invalid_json")
    return _event_from_object(document, limits)


# ------------------------------------------------------------------ binary mode


def decode_header(attribute: str, raw: bytes, limits: EventLimits = DEFAULT_LIMITS) -> str:
    """A ``ce-`` header's value, percent-decoded as HTTP's and NATS's bindings define it."""
    _check_name(attribute, limits)
    # a percent-encoded character is at most 3 bytes per UTF-8 byte: cap before decoding
    if len(raw) > 12 * _value_limit(attribute, limits):
        _over_length(attribute, limits)
    if any(b < 0x20 or b > 0x7E for b in raw):
        _invalid(
            f"header ce-{attribute} holds characters outside printable ASCII; percent-encode them", "invalid_encoding"
        )
    value = raw.decode("ascii")
    if _BAD_PERCENT.search(value):
        _invalid(f"header ce-{attribute} holds an invalid percent-encoding", "invalid_encoding")
    try:
        return unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        _invalid(f"header ce-{attribute} does not percent-decode to valid UTF-8", "invalid_encoding")


def _parse_binary(ce_headers: dict[str, bytes], content_type: str | None, body: bytes, limits: EventLimits) -> NewEvent:
    attributes: dict[str, Any] = {name: decode_header(name, raw, limits) for name, raw in ce_headers.items()}
    return binary_event(attributes, content_type, body, limits)


def binary_event(
    attributes: dict[str, Any], content_type: str | None, body: bytes, limits: EventLimits = DEFAULT_LIMITS
) -> NewEvent:
    """One event in binary mode, its attributes decoded from the binding's headers: the
    data is the body, as ``content_type`` says (HTTP's, and the broker sources')."""
    if "datacontenttype" in attributes or "data" in attributes:
        _invalid("binary mode carries datacontenttype in Content-Type and data in the body", "invalid_attribute")
    if content_type is not None:
        attributes["datacontenttype"] = content_type
    data: Any = None
    data_bytes: bytes | None = None
    if body:
        media = media_type(content_type) or "application/json"
        if is_json_media(media):
            data = load_json(body, "the JSON data")
        elif media.startswith("text/"):
            try:
                data = body.decode("utf-8")
            except UnicodeDecodeError:
                data_bytes = body
            else:
                check_storable(data, "the text data")
        else:
            data_bytes = body
    return _validated(attributes, data, data_bytes, limits)


# ------------------------------------------------------------------ structured and batched modes


def _parse_batch(body: bytes, limits: EventLimits) -> list[NewEvent]:
    document = load_json(body, "the batch", check=False)  # each event is checked below
    if not isinstance(document, list):
        _invalid("a CloudEvents batch must be a JSON array of events", "invalid_batch")
    events = []
    for position, item in enumerate(document):
        if not isinstance(item, dict):
            _invalid(f"event {position} of the batch is not a JSON object", "invalid_batch")
        try:
            check_storable(item, "the event")
            events.append(_event_from_object(item, limits))
        except InvalidEventError as error:
            raise InvalidEventError(f"event {position} of the batch: {error}", error.error_type) from None
    return events


def _event_from_object(document: dict[str, Any], limits: EventLimits) -> NewEvent:
    attributes = {k: v for k, v in document.items() if v is not None}
    data = attributes.pop("data", None)
    encoded = attributes.pop("data_base64", None)
    data_bytes: bytes | None = None
    if encoded is not None:
        if data is not None:
            _invalid("an event has either data or data_base64, not both", "invalid_data")
        if not isinstance(encoded, str):
            _invalid("data_base64 must be a string", "invalid_data")
        try:
            data_bytes = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            _invalid("data_base64 is not valid base64", "invalid_data")
    return _validated(attributes, data, data_bytes, limits)


# ------------------------------------------------------------------ common checks


def _validated(attributes: dict[str, Any], data: Any, data_bytes: bytes | None, limits: EventLimits) -> NewEvent:
    for name in REQUIRED:
        if name not in attributes:
            _invalid(f"missing required attribute {name!r}", "missing_attribute")
    extensions = [name for name in attributes if name not in REQUIRED and name not in OPTIONAL]
    if len(extensions) > limits.max_extensions:
        _over_extensions(limits)
    for name, value in attributes.items():
        _check_limits(name, value, limits)
        if name in REQUIRED or name in OPTIONAL:
            if not isinstance(value, str) or not value:
                _invalid(f"attribute {name!r} must be a non-empty string", "invalid_attribute")
        elif not _EXTENSION_NAME.match(name):
            _invalid(f"extension attribute name {name!r} must be lowercase letters and digits", "invalid_attribute")
        elif isinstance(value, float) or not isinstance(value, str | int | bool):
            _invalid(f"extension attribute {name!r} must be a string, integer or boolean", "invalid_attribute")
        if isinstance(value, str):
            check_storable(value, f"attribute {name!r}")
    if attributes["specversion"] != "1.0":
        _invalid(
            f"unsupported specversion {attributes['specversion']!r}: only '1.0' is accepted", "unsupported_specversion"
        )
    reserved = reserved_attribute_error(attributes["type"], attributes["source"])
    if reserved is not None:
        _invalid(reserved, "reserved_attribute")
    instance_id = attributes.get(INSTANCE_EXTENSION)
    if instance_id is not None and not isinstance(instance_id, str):
        _invalid(f"extension {INSTANCE_EXTENSION} must be a string", "invalid_attribute")
    sdk_attributes = dict(attributes)
    if "time" in attributes:
        sdk_attributes["time"] = _parse_time(attributes["time"])
    try:  # the SDK's own validation is the last word
        CloudEvent(sdk_attributes, data_bytes if data_bytes is not None else data)
    except BaseCloudEventException as error:
        _invalid(str(error), "invalid_attribute")
    return NewEvent(
        source=attributes["source"],
        event_id=attributes["id"],
        event_type=attributes["type"],
        attributes=attributes,
        data=None if data_bytes is not None else data,
        data_bytes=data_bytes,
        instance_id=instance_id,
    )


def _check_name(name: str, limits: EventLimits) -> None:
    if len(name) > limits.max_attribute_name_length:
        _invalid(
            f"attribute name {name[:40]!r} is over {limits.max_attribute_name_length} characters "
            "(--ingress-max-attribute-name-length)",
            "limit_exceeded",
        )


def _value_limit(name: str, limits: EventLimits) -> int:
    return limits.max_id_length if name in _IDENTIFIERS else limits.max_attribute_length


def _over_length(name: str, limits: EventLimits) -> NoReturn:
    flag = "--ingress-max-id-length" if name in _IDENTIFIERS else "--ingress-max-attribute-length"
    _invalid(f"attribute {name!r} is over {_value_limit(name, limits)} characters ({flag})", "limit_exceeded")


def _over_extensions(limits: EventLimits) -> NoReturn:
    _invalid(
        f"the event has over {limits.max_extensions} extension attributes (--ingress-max-extensions)", "limit_exceeded"
    )


def _check_limits(name: str, value: Any, limits: EventLimits) -> None:
    _check_name(name, limits)
    if isinstance(value, str) and len(value) > _value_limit(name, limits):
        _over_length(name, limits)
    if isinstance(value, int) and not isinstance(value, bool) and not INT32_MIN <= value <= INT32_MAX:
        _invalid(f"extension attribute {name!r} is not a 32-bit integer ({INT32_MIN} to {INT32_MAX})", "limit_exceeded")


def _parse_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        _invalid(f"attribute 'time' is not an RFC 3339 timestamp: {value!r}", "invalid_attribute")
    if parsed.tzinfo is None:
        _invalid(f"attribute 'time' needs a UTC offset: {value!r}", "invalid_attribute")
    return parsed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(raw: bytes, what: str, *, check: bool = True) -> Any:
    """Parse JSON that PostgreSQL can store as jsonb, or raise ``InvalidEventError``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        _invalid(f"{what} is not valid UTF-8", "invalid_encoding")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        _invalid(f"{what} is nested too deeply", "invalid_json")
    except ValueError as error:
        _invalid(f"{what} is not valid JSON: {error}", "invalid_json")
    if check:
        check_storable(value, what)
    return value


# The ingress's own words for what jsonb refuses (``serialization.unstorable`` decides).
_UNSTORABLE_ANSWERS = {
    "nul": "contains a NUL character (\\u0000), which PostgreSQL cannot store",
    "surrogate": "contains a lone surrogate, which is not valid Unicode",
    "number": "holds a number out of range",
}


def check_storable(value: Any, what: str) -> None:
    """Reject what PostgreSQL's text and jsonb refuse: NUL characters, lone surrogates,
    non-finite numbers (``serialization.unstorable``, as for every other write)."""
    found = serialization.unstorable(value)
    if found is not None:
        answer = _UNSTORABLE_ANSWERS.get(found.kind, f"cannot be stored: {found.reason}")
        _invalid(f"{what} {answer}", "invalid_data")
