"""``amqp://`` broker URLs the relayer refuses, each naming the problem. Publishing to the
machine's RabbitMQ: ``tests/system/test_relayer_amqp.py``."""

from __future__ import annotations

import pytest

from kenning.errors import ConfigurationError
from kenning_relayer.targets import check_url


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "?exchange=x&routing_key=e.{kind}",
            "routing_key template 'e.{kind}' has unknown placeholder {kind}; known: {type}, {source}, {subject}, {id}",
        ),
        ("?routing_key={type!r}", "routing_key template '{type!r}' has unknown placeholder {type!r}"),
        ("?routing_key={type", "routing_key template '{type' is invalid: "),
        ("?exchnage=x", "has unknown option 'exchnage'; amqp:// takes exchange, routing_key, heartbeat"),
        ("?exchange=a&exchange=b", "gives 'exchange' twice"),
    ],
)
def test_bad_amqp_urls_are_refused_naming_the_problem(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_url(f"amqp://guest:secret@127.0.0.1:5672/{query}")
    assert message in str(refused.value) and "secret" not in str(refused.value)
