"""Continue-as-new keeps a resume flat (issue 29, item 1): the same message loop, one
recorded step per message, run to ``steps`` messages with ``continue_as_new`` every
``every`` and without it; the cost of a resume measured early and late in each.

A resume is what a waiting instance pays for its next message: the send wakes it, a
worker claims it, loads and replays its history, and takes the message. Measured on the
database's clocks as the message's ``consumed_at - sent_at`` (send committed to receive
begun), ``samples`` resumes each early (after ``early`` messages) and late (the last
``samples`` messages), the median reported. Between the samples the mailbox is filled in
bulk while the instance waits, ``CHUNK`` at a time and vacuumed after each, so the loop runs through them with one
resume per chunk instead of one per message: both loops reach ``steps``, the one without
continue-as-new too (a resume per message would replay its whole history every time).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import psycopg

from kenning.client import Client
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.workflows import bench_message_loop

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
TOPIC = "work"
# Messages put in the mailbox at once between the samples, a vacuum after each chunk.
CHUNK = 1000
# As autovacuum would (a test server may run with it off): a consumed message leaves a dead
# entry in the mailbox's partial index and a deleted history row a dead tuple, and without a
# vacuum every receive scans past all of them, so any loop's receives slow down as it goes
# (measured: 300 -> 50 receives a second over 70,000 messages). Only the replay is measured.
_VACUUM = "VACUUM (ANALYZE) kenning_messages, kenning_history, kenning_instances"

# the mailbox filled in one statement (the instance waits: nothing races it); the client's
# send after it takes the mailbox lock and wakes the instance, as any send does
_FILL = """
INSERT INTO kenning_messages (instance_id, topic, message_id, data)
SELECT %(id)s, %(topic)s, %(prefix)s || g, to_jsonb(g) FROM generate_series(1, %(count)s) AS g
"""
_IDLE = """
SELECT i.status = 'waiting_for_message'
       AND NOT EXISTS (SELECT FROM kenning_messages AS m
                       WHERE m.instance_id = i.id AND m.topic = %(topic)s AND m.consumed_step_id IS NULL)
FROM kenning_instances AS i WHERE i.id = %(id)s
"""
_TAKEN_AFTER = """
SELECT extract(epoch FROM consumed_at - sent_at) FROM kenning_messages
WHERE instance_id = %(id)s AND message_id = %(message_id)s
"""


async def _idle(conn: Conn, instance_id: str, timeout: float = 600.0) -> None:
    """Until the instance waits for a message with none left in its mailbox."""
    deadline = time.monotonic() + timeout
    while True:
        row = await (await conn.execute(_IDLE, {"id": instance_id, "topic": TOPIC})).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"instance {instance_id} did not come to wait for a message")
        await asyncio.sleep(0.005)


async def _advance(client: Client, conn: Conn, instance_id: str, count: int) -> None:
    """``count`` messages taken, ``CHUNK`` at a time without a resume between them (each
    chunk's last send wakes the instance: one resume per chunk)."""
    while count > 0:
        chunk = min(count, CHUNK)
        if chunk > 1:
            prefix = f"bulk-{uuid.uuid4().hex[:12]}-"
            await conn.execute(_FILL, {"id": instance_id, "topic": TOPIC, "prefix": prefix, "count": chunk - 1})
        await client.send_message(instance_id, TOPIC, -1)
        await _idle(conn, instance_id)
        await conn.execute(_VACUUM)
        count -= chunk


async def _resumes(client: Client, conn: Conn, instance_id: str, samples: int) -> list[float]:
    """``samples`` resumes, one message each, in milliseconds."""
    taken: list[float] = []
    for _ in range(samples):
        message_id = await client.send_message(instance_id, TOPIC, 0)
        await _idle(conn, instance_id)
        row = await (await conn.execute(_TAKEN_AFTER, {"id": instance_id, "message_id": message_id})).fetchone()
        assert row is not None and row[0] is not None
        taken.append(1000 * float(row[0]))
    return taken


async def _loop(client: Client, conn: Conn, *, steps: int, every: int, early: int, samples: int) -> dict[str, Any]:
    started = time.monotonic()
    instance = (await client.start(bench_message_loop, every=every)).instance_id
    await _idle(conn, instance)
    await _advance(client, conn, instance, early)
    early_ms = await _resumes(client, conn, instance, samples)
    await _advance(client, conn, instance, steps - early - 2 * samples)
    late_ms = await _resumes(client, conn, instance, samples)
    await client.send_message(instance, TOPIC, "stop")
    done = await client.result(instance, timeout=600)
    if done != steps:
        raise RuntimeError(f"the message loop counted {done} messages, expected {steps}")
    row = await (await conn.execute("SELECT run FROM kenning_instances WHERE id = %s", (instance,))).fetchone()
    early_median, late_median = statistics.median(early_ms), statistics.median(late_ms)
    return {
        "runs": None if row is None else int(row[0]),
        "seconds": round(time.monotonic() - started, 1),
        "resume_ms_early": round(early_median, 2),
        "resume_ms_late": round(late_median, 2),
        # 1.0 is flat; growing with the history gives late / early far above it
        "late_over_early": round(late_median / early_median, 2),
    }


async def run_resume(url: str, steps: int, every: int, early: int, samples: int) -> dict[str, Any]:
    """The loop with continue-as-new every ``every`` messages and without, ``steps`` each."""
    with fleet(url) as running:
        running.spawn(["worker", "--app", "kenning_devtools.bench.workflows", "--no-migrate"], ready="worker.started")
        async with Client(url) as client, await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            shape = {"steps": steps, "early": early, "samples": samples}
            with_it = await _loop(client, conn, every=every, **shape)
            without = await _loop(client, conn, every=0, **shape)
    return {
        "steps": steps,
        "continue_every": every,
        "early_after": early,
        "samples": samples,
        "with_continue_as_new": with_it,
        "without": without,
    }
