"""The flow section (issue 35): keyed bursts of debounced starts through a real worker.

``starts`` starts over ``keys`` keys, each key's in ``bursts`` bursts of back-to-back
starts. The bursts go in rounds: round ``b`` runs every key's ``b``-th burst, ``CLIENTS``
keys at a time, so a start waits for at most that many others (never near a quiet
period, whatever the machine's speed), and a key's next burst begins no sooner than
``GAP_PERIODS`` periods after its last. Counted: the instances each key started (exactly
``bursts`` expected) and the starts each folded; and the delay from the end of a key's
quiet period (its burst's last start plus the period, the database clock) to its
instance's start (its first claim, the same clock)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from kenning.client import Client
from kenning_devtools.bench.flowflows import PERIOD, bench_debounced
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import summary_ms

APP = "kenning_devtools.bench.flowflows"
GAP_PERIODS = 3.0  # a key's bursts at least this many quiet periods apart
CLIENTS = 16  # keys bursting at once: a start queues behind at most this many


async def run_flow(url: str, starts: int, keys: int, bursts: int) -> dict[str, Any]:
    per_burst = max(1, starts // (keys * bursts))
    with fleet(url) as running:
        running.spawn(["worker", "--app", APP, "--no-migrate"], "worker.started")
        await asyncio.sleep(0.3)
        async with Client(url) as client:
            begun = time.monotonic()
            ended = [0.0] * keys  # when each key's last burst ended (the loop's clock)
            per_key: list[list[str]] = [[] for _ in range(keys)]
            turns = asyncio.Semaphore(CLIENTS)

            async def burst(k: int, b: int) -> None:
                async with turns:
                    await asyncio.sleep(max(0.0, ended[k] + PERIOD * GAP_PERIODS - time.monotonic()))
                    for n in range(per_burst):
                        started = await client.start(bench_debounced, key=f"k{k}", burst=b, n=n)
                        per_key[k].append(started.instance_id)
                    ended[k] = time.monotonic()

            for b in range(bursts):
                await asyncio.gather(*(burst(k, b) for k in range(keys)))
            start_seconds = time.monotonic() - begun
        expected = keys * bursts
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM kenning_instances WHERE workflow_name = %s AND status = 'completed'",
                    (bench_debounced.name,),
                )
                row = await cur.fetchone()
                done = row[0] if row else 0
                if done >= expected:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {done} of {expected} debounced instances completed")
                await asyncio.sleep(0.1)
            await asyncio.sleep(PERIOD * 2)  # an unexpected extra burst would show by now
            cur = await conn.execute(
                "SELECT b.flow_key, b.folded, i.id,"
                " 1000 * extract(epoch FROM i.started_at - (b.last_at + make_interval(secs => b.period_seconds)))"
                " FROM kenning_bursts AS b JOIN kenning_instances AS i ON i.id = b.instance_id"
                " WHERE b.workflow_name = %s",
                (bench_debounced.name,),
            )
            rows = await cur.fetchall()
    instances_per_key: dict[str, int] = {}
    for key, *_ in rows:
        instances_per_key[str(key)] = instances_per_key.get(str(key), 0) + 1
    callers_ids = {i for ids in per_key for i in ids}
    delays = [float(r[3]) for r in rows if r[3] is not None]
    folded = sum(int(r[1]) for r in rows)
    uneven = sum(1 for k in range(keys) if instances_per_key.get(f"k{k}", 0) != bursts)
    return {
        "starts": keys * bursts * per_burst,
        "keys": keys,
        "bursts_per_key": bursts,
        "starts_per_burst": per_burst,
        "period_seconds": PERIOD,
        "start_seconds": round(start_seconds, 2),
        "starts_per_second": round(keys * bursts * per_burst / start_seconds, 1),
        "instances": len(rows),
        "instances_expected": expected,
        "keys_with_other_counts": uneven,
        "starts_folded": folded,
        "bursts_short_of_starts": sum(1 for r in rows if int(r[1]) != per_burst),
        # every start's caller learned the id of an instance of its burst, and those are all there are
        "exact": len(rows) == expected
        and uneven == 0
        and folded == keys * bursts * per_burst
        and callers_ids == {str(r[2]) for r in rows},
        "release_delay": {**summary_ms(delays), "min_ms": round(min(delays), 2)} if delays else None,
    }
