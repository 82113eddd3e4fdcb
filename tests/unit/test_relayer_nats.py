"""``nats://`` broker URLs: what the relayer writes Kenning's NATS source reads back, and the
URLs it refuses, each naming the problem. Publishing to the machine's NATS JetStream:
``tests/system/test_relayer_nats.py``."""

from __future__ import annotations

import dataclasses

import pytest

from kenning.errors import ConfigurationError
from kenning_ingress.sources.bindings import nats_event
from kenning_relayer.nats import NatsAddress, to_nats_message
from kenning_relayer.settings import ContentMode
from kenning_relayer.targets import check_url
from tests.relayer_support import (
    sample_row,
)


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_what_the_relayer_writes_kennings_nats_source_reads_back_exactly(mode: ContentMode) -> None:
    """Attribute values a header cannot hold as they are (a space, '%', non-ASCII, a '%41'
    that must not become 'A', a media type with parameters) come back exactly."""
    row = dataclasses.replace(
        sample_row(),
        source="/a b",
        subject="50% café",
        content_type='text/plain; charset="utf-8"',
        data="déjà a%41b",
        extensions={"note": 'a%41b "quoted"', "priority": 5},
    )
    headers, payload = to_nats_message(row, mode)
    if mode == "binary":
        assert headers["ce-subject"] == "50%25%20caf%C3%A9" and headers["ce-source"] == "/a%20b"
        assert headers["ce-datacontenttype"] == "text/plain;%20charset=%22utf-8%22" and "content-type" not in headers
        assert all(value.isascii() and value.isprintable() and " " not in value for value in headers.values())
    event = nats_event(headers, payload)
    assert (event.source, event.event_id, event.event_type) == ("/a b", row.id, "order.placed")
    attributes = dict(event.attributes)
    attributes.pop("time")
    assert attributes == {
        "id": row.id,
        "source": "/a b",
        "type": "order.placed",
        "specversion": "1.0",
        "subject": "50% café",
        "datacontenttype": 'text/plain; charset="utf-8"',
        "note": 'a%41b "quoted"',
        # binary mode carries an extension as its string; structured mode keeps the JSON number
        "priority": "5" if mode == "binary" else 5,
    }
    assert event.data == "déjà a%41b"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?subject=events.{kind}", "subject template 'events.{kind}' has unknown placeholder {kind}"),
        ("?subject=events.{type:>10}", "subject template 'events.{type:>10}' has unknown placeholder {type:>10}"),
        ("?subjet=events", "has unknown option 'subjet'; nats:// takes subject, stream"),
    ],
)
def test_bad_nats_urls_are_refused_naming_the_problem(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_url(f"nats://user:secret@127.0.0.1:4222{query}")
    assert message in str(refused.value) and "secret" not in str(refused.value)


def test_tls_urls_are_nats_targets_as_they_are_sources() -> None:
    url = "tls://user:secret@nats.example:4222?subject=events.{type}"
    assert check_url(url) == url
    address = NatsAddress.parse(url)
    assert address.server == "tls://user:secret@nats.example:4222"  # nats-py connects over TLS
    assert address.display == "tls://user:***@nats.example:4222?subject=events.{type}"
