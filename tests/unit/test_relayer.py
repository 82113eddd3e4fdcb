"""The relayer's broker URLs as it shows them: without their credentials. The relayer
against a real receiver: ``tests/system/test_relayer.py``."""

from __future__ import annotations

import pytest

from kenning.core.urls import hide_credentials
from kenning_relayer.nats import NatsAddress
from kenning_relayer.targets import NATS_SCHEMES


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://u:secret@rabbit:5672/shop?exchange=e", "amqp://u:***@rabbit:5672/shop?exchange=e"),
        ("nats://secret@nats:4222?subject=s", "nats://***@nats:4222?subject=s"),  # nats-py's token form
        ("tls://secret@nats:4222", "tls://***@nats:4222"),
        ("https://hook:secret@hooks.example/in", "https://hook:***@hooks.example/in"),
        ("amqp://u:secret@[::1/x", "amqp://***"),  # unparsable: nothing but the scheme
        ("http://hooks.example/in", "http://hooks.example/in"),
    ],
)
def test_broker_urls_are_shown_without_their_credentials(url: str, shown: str) -> None:
    assert hide_credentials(url) == shown
    if url.startswith(NATS_SCHEMES):  # what every line of the target is bound with
        assert NatsAddress.parse(url).display == shown
