"""A database that does not answer, as a ``Client``'s caller meets it (issue 33, item 5):
``DatabaseUnavailableError``, a ``KenningError`` saying to try again with the id that
makes a retry safe; a waiting call's retries end with its ``timeout``, not after the
client's ``retry_seconds``; a start, which is not retried, says which instance id to
start again with. Nothing listens on the port: every connect is refused."""

from __future__ import annotations

import asyncio

import pytest

from kenning import Client, DatabaseUnavailableError, KenningError
from kenning.db import errors as dberrors
from tests.apps import published

DOWN = "postgresql://nobody@127.0.0.1:1/none"


async def test_a_database_that_is_away_is_a_kenning_error_saying_to_try_again() -> None:
    async with Client(DOWN, retry_seconds=0) as client:
        with pytest.raises(DatabaseUnavailableError, match=r"status: the database is unavailable.*try again"):
            await client.status("i-1")
        with pytest.raises(DatabaseUnavailableError, match="try again with message_id='m-1': it is sent once"):
            await client.send_message("i-1", "go", message_id="m-1")
        with pytest.raises(DatabaseUnavailableError, match="try again with instance_id='o-1': it starts once"):
            await client.start(published.published_order, instance_id="o-1", customer="c", region="eu")
        with pytest.raises(KenningError) as raised:
            await client.list()
        assert dberrors.is_unavailable(raised.value)  # still an outage to code that judges errors


async def test_a_waiting_call_retries_no_longer_than_its_timeout() -> None:
    async with Client(DOWN, retry_seconds=600) as client:
        # (a deadline for the test, not a timing: without the bound each would retry 600 s)
        with pytest.raises(DatabaseUnavailableError, match="try again with request_id='r-1'"):
            await asyncio.wait_for(client.request("i-1", "go", request_id="r-1", timeout=0.5), 60)
        with pytest.raises(DatabaseUnavailableError, match="status"):
            await asyncio.wait_for(client.result("i-1", timeout=0.5), 60)
        with pytest.raises(DatabaseUnavailableError, match="get_value"):
            await asyncio.wait_for(client.get_value("i-1", "customer", timeout=0.5), 60)
