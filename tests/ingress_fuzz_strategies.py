"""Hypothesis strategies for fuzzing the ingress: headers as uvicorn hands them over,
binary-mode and structured CloudEvents, nearly valid ones, batches. Shared by the
parser's fuzz test (tests/unit/test_ingress_fuzz.py) and the app's on a database
(tests/integration/test_ingress_fuzz.py)."""

from __future__ import annotations

import json
from urllib.parse import quote_from_bytes

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kenning_ingress.parsing import INT32_MAX, INT32_MIN

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
