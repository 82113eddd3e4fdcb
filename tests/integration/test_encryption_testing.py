"""kenning.testing with a key set (issue 36, item 1): either backend seals what it
stores and opens what a test reads; without the key a state shows "encrypted". And the
rotation seals rows written before encryption was on."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import psycopg
import pytest

from kenning import Client, WorkflowFailedError, codecs
from kenning.commands.encryption import rotate
from kenning.db import Database
from kenning.storage import instances as instances_sql
from kenning.testing import WorkflowEnvironment
from tests.apps import encrypted
from tests.logguard import expect_log

MARKER = "MARKER-5500-0000-0000-0004"
KEY = "t1:" + base64.b64encode(b"\x07" * 32).decode()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(codecs.KEYS_VARIABLE, raising=False)
    codecs.configure(keys=KEY)
    yield
    codecs.reset()


@pytest.mark.parametrize("backend", ["memory", "postgresql"])
async def test_either_backend_round_trips_every_payload_with_a_key(
    backend: str, database_url: str, sql: psycopg.Connection[tuple[object, ...]], key: None
) -> None:
    expect_log("instance.failed", workflow="encryption.fails")
    expect_log("activity.retrying")
    url = database_url if backend == "postgresql" else None
    async with WorkflowEnvironment(encrypted.app, database_url=url, migrate=False) as env:
        paid = await env.start(encrypted.pay, card=MARKER)
        assert await env.request(paid.instance_id, "note", f"note {MARKER}") == {"noted": f"note {MARKER}"}
        paid_result = f"paid receipt of {MARKER} after note {MARKER}, carbon of {MARKER}"  # carbon: a bytes result
        assert await paid.result() == paid_result
        failing = await env.start(encrypted.fails, card=MARKER)
        with pytest.raises(WorkflowFailedError, match=f"cannot ship to {MARKER}"):
            await failing.result()
        state = await paid.state()
        assert state.values["receipt"] == {"receipt": f"receipt of {MARKER}"}
        assert state.result == {"result": paid_result}
        codecs.configure(keys="")
        hidden = await paid.state()
        assert hidden.result == {"result": "encrypted"} and hidden.values["receipt"] == "encrypted"
    if backend == "postgresql":
        row = sql.execute("SELECT CAST(input AS text), CAST(result AS text) FROM kenning_instances").fetchall()
        assert row and not any(MARKER in str(r) for r in row)


async def test_rotate_seals_rows_written_before_encryption_was_on(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written plain (no key yet) are sealed by the rotation, and still read."""
    monkeypatch.delenv(codecs.KEYS_VARIABLE, raising=False)
    codecs.reset()
    try:
        async with Client(database=database) as client:
            started = await client.start(encrypted.fails, card=MARKER)
        assert MARKER in str(sql.execute("SELECT CAST(input AS text) FROM kenning_instances").fetchone())
        codecs.configure(keys=KEY)
        counts = await rotate(database, batch_size=1)
        assert counts["kenning_instances.input"] == 1
        assert MARKER not in str(sql.execute("SELECT CAST(input AS text) FROM kenning_instances").fetchall())
        assert (await rotate(database, batch_size=1))["kenning_instances.input"] == 0
        async with database.connection() as conn:
            row = await instances_sql.instance_get(conn, started.instance_id)
        assert row is not None and codecs.unseal(row.input) == {"card": MARKER}
    finally:
        codecs.reset()
