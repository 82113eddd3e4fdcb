"""``--source URL`` refusals keep the credentials out: every refusal hides the secret, and
the redaction hides a password, a token and a URL it cannot parse. The ingress refusing
them: ``tests/system/test_sources_addresses.py``."""

from __future__ import annotations

import pytest

from kenning.core.urls import hide_credentials
from kenning.errors import ConfigurationError
from kenning_ingress.sources.addresses import parse_source

SECRET = "S3CRETpw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"amqp://u:{SECRET}@h:99999/?queue=q", "source 'amqp://u:***@h:99999/?queue=q' is invalid: Port out of"),
        (f"amqp://u:{SECRET}@h/?queue=q&x=1", "source 'amqp://u:***@h/?queue=q&x=1' has unknown option 'x'"),
        (f"tls://{SECRET}@h:4222/p?stream=s&consumer=c", "source 'tls://***@h:4222/p?stream=s&consumer=c': a nats://"),
        (f"nats://{SECRET}@h?stream=s&consumer=c&prefetch=0", "source 'nats://***@h?stream=s&consumer=c&prefetch=0'"),
    ],
)
def test_every_refusal_hides_the_secret(url: str, shown: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_source(url)
    assert str(refused.value).startswith(shown) and SECRET not in str(refused.value)


def test_redacted_hides_a_password_a_token_and_a_url_it_cannot_parse() -> None:
    assert hide_credentials("amqp://u:pw@h/v?queue=q") == "amqp://u:***@h/v?queue=q"
    assert hide_credentials("nats://TOKEN@h:4222?stream=s") == "nats://***@h:4222?stream=s"
    assert hide_credentials("tls://[::1:4222") == "tls://***"
    assert hide_credentials("nats://h:4222?stream=s") == "nats://h:4222?stream=s"
