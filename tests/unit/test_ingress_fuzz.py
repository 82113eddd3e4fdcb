"""Fuzzing the ingress's CloudEvents parser alone: every outcome is an event or an
``InvalidEventError``, an accepted event is within the limits and storable, and any
printable header is percent-decoded. The app on a real database:
``tests/integration/test_ingress_fuzz.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from urllib.parse import quote_from_bytes

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kenning_ingress import IngressSettings, create_app
from kenning_ingress.parsing import (
    DEFAULT_LIMITS,
    INT32_MAX,
    INT32_MIN,
    InvalidEventError,
    check_storable,
    parse_request,
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis folder in the checkout; failures print their example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


ATTRIBUTES = ["id", "source", "type", "specversion", "subject", "time", "dataschema", "kenninginstanceid", "myext"]


# header bytes as uvicorn hands them over: no CR, LF or NUL, anything else
header_bytes = st.binary(max_size=40).map(lambda b: bytes(c for c in b if c not in (0, 10, 13)))


percent_encoded = st.binary(max_size=12).map(lambda b: quote_from_bytes(b, safe="").encode())


percent_garbage = st.sampled_from([b"%", b"%0", b"%ZZ", b"%C0%A0", b"%FF", b"%ED%A0%80", b"%00", b"%25", b"%F4%90"])


header_value = st.lists(
    st.one_of(header_bytes, percent_encoded, percent_garbage, st.sampled_from([b"1.0", b"t", b"/s"])), max_size=4
).map(b"".join)


# header names are ASCII tokens on the wire (httptools refuses anything else)
token = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"), max_size=8)


ce_name = st.one_of(st.sampled_from([*ATTRIBUTES, "data", "datacontenttype", "X", "e" * 21, ""]), token)


binary_headers = st.lists(st.tuples(ce_name.map(lambda n: b"ce-" + n.encode("ascii")), header_value), max_size=10)


content_type = st.sampled_from(
    [
        b"application/json",
        b"text/plain; charset=utf-8",
        b"application/octet-stream",
        b"application/cloudevents+json",
        b"application/cloudevents-batch+json",
        b"application/cloudevents+xml",
        b"",
    ]
)


json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([INT32_MIN, INT32_MAX, INT32_MIN - 1, INT32_MAX + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)


json_value = st.recursive(
    json_scalar,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


valid_core = st.fixed_dictionaries(
    {"specversion": st.just("1.0"), "id": st.text(min_size=1, max_size=8), "source": st.just("/fuzz")},
    optional={"type": st.text(max_size=8)},
)


event_object = st.builds(
    lambda core, extra: {**core, **extra},
    valid_core,
    st.dictionaries(st.sampled_from([*ATTRIBUTES, "data", "data_base64", "BadName"]), json_value, max_size=5),
)


structured_body = st.one_of(
    event_object.map(lambda d: json.dumps(d).encode()),
    st.lists(event_object, max_size=3).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=60),
    json_value.map(lambda v: json.dumps(v).encode()),
)


def _request(headers: list[tuple[bytes, bytes]], media: bytes, body: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    return ([(b"content-type", media)] if media else []) + headers, body


def _nearly_valid(event_id: bytes, event_type: bytes, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    required = [(b"ce-specversion", b"1.0"), (b"ce-id", event_id or b"1"), (b"ce-source", b"/fuzz")]
    return [*required, (b"ce-type", event_type or b"t"), *extra]


nearly_valid_headers = st.builds(
    _nearly_valid,
    percent_encoded,
    header_value,
    st.lists(st.tuples(ce_name.map(lambda n: b"ce-" + n.encode()), header_value), max_size=3),
)


nearly_valid_object = st.builds(
    lambda core, event_type, extra: {**core, "type": event_type or "t", **extra},
    valid_core,
    st.text(max_size=6),
    st.dictionaries(st.sampled_from(["subject", "myext", "data", "kenninginstanceid"]), json_value, max_size=2),
)


requests = st.one_of(
    st.builds(_request, binary_headers, content_type, st.one_of(structured_body, st.binary(max_size=40))),
    st.builds(_request, nearly_valid_headers, content_type, st.one_of(structured_body, st.binary(max_size=40))),
    st.builds(
        _request,
        st.just([]),
        st.just(b"application/cloudevents+json"),
        nearly_valid_object.map(lambda d: json.dumps(d).encode()),
    ),
    st.builds(
        _request,
        st.just([]),
        st.just(b"application/cloudevents-batch+json"),
        st.lists(nearly_valid_object, max_size=3).map(lambda d: json.dumps(d).encode()),
    ),
)


@FUZZ
@given(request=requests)
def test_the_parser_answers_events_or_invalid_event_error(request: tuple[list[tuple[bytes, bytes]], bytes]) -> None:
    headers, body = request
    try:
        events, _ = parse_request(headers, body)
    except InvalidEventError as invalid:
        assert str(invalid) and invalid.error_type
        return
    for event in events:  # what it accepts, PostgreSQL can store and the limits allow
        check_storable(event.attributes, "attributes")
        check_storable(event.data, "data")
        assert len(event.event_id) <= DEFAULT_LIMITS.max_id_length
        assert len(event.source) <= DEFAULT_LIMITS.max_id_length
        for name, value in event.attributes.items():
            assert len(name) <= DEFAULT_LIMITS.max_attribute_name_length
            if isinstance(value, int) and not isinstance(value, bool):
                assert INT32_MIN <= value <= INT32_MAX


@FUZZ
@given(raw=st.binary(max_size=30).map(lambda b: bytes(c for c in b if 0x20 <= c <= 0x7E)))
def test_percent_decoding_of_any_printable_header(raw: bytes) -> None:
    headers = [(b"ce-specversion", b"1.0"), (b"ce-id", b"1"), (b"ce-source", b"/s"), (b"ce-type", raw or b"t")]
    try:
        (event,), _ = parse_request(headers, b"")
    except InvalidEventError as invalid:
        assert invalid.error_type in ("invalid_encoding", "invalid_data", "invalid_attribute")
        return
    assert event.event_type.encode("utf-8")  # decoded to valid, storable UTF-8
    check_storable(event.event_type, "type")


class AppUnderTest:
    """The ingress app, started once on its own event loop, called example by example."""

    def __init__(self, database_url: str) -> None:
        self.runner = asyncio.Runner()
        self.app = create_app(IngressSettings(database_url=database_url))
        self._stack = contextlib.AsyncExitStack()
        self.http: httpx.AsyncClient | None = None

    def __enter__(self) -> AppUnderTest:
        async def start() -> None:
            await self._stack.enter_async_context(self.app.router.lifespan_context(self.app))
            transport = httpx.ASGITransport(app=self.app)  # raises whatever the app raises
            self.http = await self._stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://ingress")
            )

        self.runner.run(start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.run(self._stack.aclose())
        self.runner.close()

    def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> httpx.Response:
        assert self.http is not None
        return self.runner.run(self.http.request(method, path, headers=headers, content=body))


@pytest.fixture
def app(database_url: str) -> Iterator[AppUnderTest]:
    with AppUnderTest(database_url) as started:
        yield started
