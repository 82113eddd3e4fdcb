"""Long-running coverage-guided fuzzing of the ingress's CloudEvents parsing (atheris).

Not run in CI (tests/integration/test_ingress_fuzz.py is the quick hypothesis version). Run::

    .venv/bin/pip install atheris          # not in the dev extra: some releases ship no wheel for a given Python
    .venv/bin/python scripts/fuzz_ingress.py -max_total_time=600 [corpus_dir]

Every input becomes one request: binary-mode headers and a body, in one of the content
modes. The parser must answer events or ``InvalidEventError``; anything else is a crash,
which atheris reports with the input that caused it. Accepted events must hold only what
PostgreSQL can store and stay within the limits.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from kenning_ingress.parsing import (
        DEFAULT_LIMITS,
        INT32_MAX,
        INT32_MIN,
        InvalidEventError,
        check_storable,
        parse_request,
    )

CONTENT_TYPES = [
    b"application/json",
    b"text/plain",
    b"application/octet-stream",
    b"application/cloudevents+json",
    b"application/cloudevents-batch+json",
    b"",
]


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    headers: list[tuple[bytes, bytes]] = []
    media = CONTENT_TYPES[fdp.ConsumeIntInRange(0, len(CONTENT_TYPES) - 1)]
    if media:
        headers.append((b"content-type", media))
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        name = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12))
        value = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        # what an HTTP parser can hand over: no CR, LF or NUL
        value = bytes(c for c in value if c not in (0, 10, 13))
        headers.append((b"ce-" + name, value))
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    try:
        events, _ = parse_request(headers, body)
    except InvalidEventError:
        return
    for event in events:
        check_storable(event.attributes, "attributes")  # raises InvalidEventError: a finding
        check_storable(event.data, "data")
        assert len(event.event_id) <= DEFAULT_LIMITS.max_id_length
        assert len(event.source) <= DEFAULT_LIMITS.max_id_length
        for name, value in event.attributes.items():
            assert len(name) <= DEFAULT_LIMITS.max_attribute_name_length, name
            if isinstance(value, int) and not isinstance(value, bool):
                assert INT32_MIN <= value <= INT32_MAX, (name, value)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
