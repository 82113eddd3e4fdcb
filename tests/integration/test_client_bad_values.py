"""A value PostgreSQL cannot take reaches ``Client``'s caller as a Kenning error naming the
field, decided before any statement (issue 33, item 5).

Before, a NUL in a ``where=`` value, ``limit=-1``, a NUL or a lone surrogate in a search
attribute and the like raised psycopg's own exceptions (``DataError``,
``InvalidRowCountInLimitClause``) or ``UnicodeEncodeError`` from the driver, none of
which ``except KenningError`` catches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kenning import Client, KenningError, UnstorableValueError
from kenning.client import InvalidInputError
from kenning.db import Database
from tests.apps import published

NUL = "c\x00"
SURROGATE = "c\udcff"


async def refused(call: Callable[[], Awaitable[Any]], error: type[KenningError], *names: str) -> str:
    """The call raises ``error`` (a ``KenningError``), whose message names every one of ``names``."""
    with pytest.raises(KenningError) as raised:
        await call()
    assert isinstance(raised.value, error), repr(raised.value)
    message = str(raised.value)
    assert all(name in message for name in names), message
    return message


Call = Callable[[], Awaitable[Any]]


def calls_with(client: Client, instance_id: str, bad: str) -> list[tuple[Call, type[KenningError], str]]:
    """Every client call given ``bad`` in one field, the error it must raise and the field it names."""
    searched = published.published_order.options(search_attributes={"customer": bad})
    return [
        (lambda: client.list(where={"customer": bad}), InvalidInputError, "customer"),
        (lambda: client.list(where={bad: "x"}), InvalidInputError, "key"),
        (lambda: client.start(searched, customer="c", region="eu"), InvalidInputError, "customer"),
        (lambda: client.status(bad), InvalidInputError, "instance id"),
        (lambda: client.cancel(bad), InvalidInputError, "instance id"),
        (lambda: client.result(bad, timeout=1), InvalidInputError, "instance id"),
        (lambda: client.values(bad), InvalidInputError, "instance id"),
        (lambda: client.get_value(instance_id, bad), InvalidInputError, "key"),
        (lambda: client.send_message(bad, "go"), InvalidInputError, "instance id"),
        (lambda: client.send_message(instance_id, bad), InvalidInputError, "topic"),
        (lambda: client.send_message(instance_id, "go", message_id=bad), InvalidInputError, "message id"),
        (lambda: client.request(instance_id, "go", request_id=bad, timeout=1), InvalidInputError, "request id"),
        (lambda: client.publish(bad), InvalidInputError, "channel"),
        (lambda: client.list(workflow=bad), InvalidInputError, "workflow"),
        (lambda: client.send_message(instance_id, "go", {"a": bad}), UnstorableValueError, "data"),
    ]


async def test_bad_values_are_kenning_errors_naming_the_field(database: Database) -> None:
    async with Client(database=database) as client:
        started = await client.start(published.published_order, customer="c-1", region="eu")
        instance_id = started.instance_id
        for bad, what in ((NUL, "NUL"), (SURROGATE, "surrogate")):
            for call, error, field in calls_with(client, instance_id, bad):
                await refused(call, error, field, what)
        await refused(lambda: client.list(limit=-1), InvalidInputError, "limit")
        await refused(lambda: client.list(where={"customer": "c-1"}, limit=-1), InvalidInputError, "limit")
        # nothing was sent or started by any of them
        assert [row.id for row in await client.list()] == [instance_id]
