"""Fuzzing the ingress's CloudEvents parser alone: every outcome is an event or an
``InvalidEventError``, an accepted event is within the limits and storable, and any
printable header is percent-decoded. The app on a real database:
``tests/integration/test_ingress_fuzz.py``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kenning_ingress.parsing import (
    DEFAULT_LIMITS,
    INT32_MAX,
    INT32_MIN,
    InvalidEventError,
    check_storable,
    parse_request,
)
from tests.ingress_fuzz_strategies import (
    FUZZ,
    requests,
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
