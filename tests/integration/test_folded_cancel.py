"""A cancel committed while an activity runs stops the next step before its rows are
written, when that step carries the activity's held-back record in its own transaction
(a message, a published value, a stream entry): as a flush before the step did, the
record's fence reads the cancel, the record commits alone and the instance is cancelled.

Stream writes lost this with the fold of 86fb578 (the entry was written after the cancel);
messages and values kept it through their flush, and keep it through the fold.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.apps import folded
from tests.support import check_invariants, eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]

WRITTEN = {
    "message": "SELECT count(*) FROM kenning_messages",
    "value": "SELECT count(*) FROM kenning_values",
    "stream": "SELECT count(*) FROM kenning_stream_entries",
}


@pytest.mark.parametrize("write", sorted(WRITTEN))
async def test_a_cancel_seen_by_the_held_back_record_stops_the_write(database: Database, sql: Sql, write: str) -> None:
    folded.RUNNING, folded.RELEASE = asyncio.Event(), asyncio.Event()
    async with Client(database=database) as client, running_worker(database, folded.app):
        peer = (await client.start(folded.waits)).instance_id
        started = await client.start(folded.after_activity, write=write, peer=peer)
        await asyncio.wait_for(folded.RUNNING.wait(), 20)
        assert await client.cancel(started.instance_id)
        folded.RELEASE.set()
        await eventually(
            lambda: (
                sql.execute(
                    "SELECT count(*) FROM kenning_instances WHERE id = %s AND status = 'cancelled'",
                    (started.instance_id,),
                ).fetchone()
                == (1,)
            ),
            timeout=20,
        )
    history = sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s", (started.instance_id,)
    ).fetchall()
    assert ("hold:1", "ActivityCompleted") in history  # the record, committed alone
    assert sql.execute(WRITTEN[write]).fetchone() == (0,), f"the {write} was written after the cancel"
    check_invariants(sql)
