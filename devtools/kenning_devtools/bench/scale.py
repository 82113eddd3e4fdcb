"""Scale: the claim and throughput with 1M finished and 100k waiting instances present,
against the same on empty tables, in one run: two scratch databases beside the bench's
own, one loaded and one empty, measured in turns (empty, loaded, loaded, empty, ...), so a
change in the shared machine's load falls on both sides alike."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from kenning.core.names import ACTIVITY_COMPLETED
from kenning.db.migrate import migrate
from kenning.hosting.embedded import with_database
from kenning_devtools.bench import throughput
from kenning_devtools.bench.limits import CLAIM

# The loaded instances' ids are the ones the start path (kenning.starting.time_ordered_hex)
# would have given instances of the measured workflow started over the past day: its name,
# then a UUIDv7's 32 hex digits (48 bits of milliseconds, version 7, variant 8). The load's
# first ids ('done-N') sorted apart from the measured run's whatever the id scheme, and so
# hid that random ids made every write land on a page of its own in 1M-entry indexes.
_DAY_MS = 86_400_000


def _past_id(kind: str, count: str) -> str:
    """SQL for the id of row ``g`` of ``count`` rows of a load, started in order through the
    day before ``%(start_ms)s`` (one instant for every statement of the load, so the
    history's ids are its instances')."""
    millis = f"%(start_ms)s - {_DAY_MS} + floor(g * {_DAY_MS}::float8 / %({count})s)::bigint"
    digest = f"md5('{kind}-' || g)"
    return (
        f"'bench_three-' || lpad(to_hex({millis}), 12, '0') || '7' || substr({digest}, 1, 3) "
        f"|| '8' || substr({digest}, 4, 15)"
    )


_FINISHED_ID = _past_id("finished", "finished")
_WAITING_ID = _past_id("waiting", "waiting")


def fill(url: str, finished: int, waiting: int) -> None:
    """Bulk-load finished instances (with history) and instances waiting on events/timers."""
    params = {
        "finished": finished,
        "waiting": waiting,
        "start_ms": time.time_ns() // 1_000_000,
        "kind": ACTIVITY_COMPLETED,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, result, finished_at, run_count) "
            f"SELECT {_FINISHED_ID}, 'bench_old', 'completed', '{{\"result\": 1}}', now(), 1 "
            "FROM generate_series(1, %(finished)s) g",
            params,
        )
        conn.execute(
            "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload) "
            f"SELECT {_FINISHED_ID}, 'bump:1', %(kind)s, 'bump', '{{\"result\": 1}}' "
            "FROM generate_series(1, %(finished)s) g",
            params,
        )
        conn.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, run_count) "
            f"SELECT {_WAITING_ID}, 'bench_old', CASE WHEN g %% 2 = 0 THEN 'waiting_for_event' "
            "ELSE 'waiting_for_timer' END, 1 FROM generate_series(1, %(waiting)s) g",
            params,
        )
        conn.execute(
            # checked: in steady state a worker checks each subscription for earlier events
            # once, right after it is made; 50,000 unchecked ones would be a catch-up burst
            "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, checked_at) "
            f"SELECT {_WAITING_ID}, 'wait_event_x:1', 'wait_event:x', 'x', now() "
            "FROM generate_series(2, %(waiting)s, 2) g",
            params,
        )
        conn.execute(
            "INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at) "
            f"SELECT {_WAITING_ID}, 'wait_timer:1', 'wait_timer', now() + interval '30 days' "
            "FROM generate_series(1, %(waiting)s, 2) g",
            params,
        )
        conn.execute("VACUUM ANALYZE")
        # write the load out now, so the measured run does not pay for its checkpoint
        # (the statement needs superuser or pg_checkpoint; without it the run pays)
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def wait_for_autovacuum(url: str, timeout: float = 120.0) -> float:
    """Wait until no autovacuum worker runs on this database (the bulk load sets them off),
    so the loaded run measures Kenning, not the load's aftermath; returns seconds waited."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() - started < timeout:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'autovacuum worker' AND datname = current_database()"
            ).fetchone()
            if row is None or row[0] == 0:
                break
            time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def claim_query_ms(url: str, repeats: int = 50) -> dict[str, Any]:
    """Median time of the claim statement when nothing is claimable (it must not scan)."""
    timings = []
    with psycopg.connect(url) as conn:
        for _ in range(repeats):
            started = time.perf_counter()
            conn.execute(
                CLAIM,
                {
                    "owner": "probe",
                    "names": ["bench_three"],
                    "limit": 10,
                    "lease_seconds": 30.0,
                    "now": None,
                    "code_version": None,
                    "pinned": [],
                },
            ).fetchall()
            conn.rollback()
            timings.append((time.perf_counter() - started) * 1000)
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + CLAIM,
                {
                    "owner": "probe",
                    "names": ["bench_three"],
                    "limit": 10,
                    "lease_seconds": 30.0,
                    "now": None,
                    "code_version": None,
                    "pinned": [],
                },
            ).fetchall()
        )
        conn.rollback()
    timings.sort()
    return {"claim_ms_median": round(timings[len(timings) // 2], 3), "uses_partial_index": "claimable" in plan}


def _sibling(url: str, suffix: str) -> tuple[str, str]:
    """A scratch database beside the bench's own: (its name, its URL)."""
    name = f"{make_url(url).database}_{suffix}"
    return name, with_database(url, name)


def _create(url: str, suffix: str) -> str:
    name, sibling = _sibling(url, suffix)
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    migrate(sibling)
    return sibling


def _drop(url: str, suffix: str) -> None:
    name, _ = _sibling(url, suffix)
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _side(runs: list[dict[str, Any]], claims: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    """One side's runs summed: workflows/s over all of them, the claim's median of medians."""
    workflows = sum(r["workflows"] for r in runs)
    return {
        "workers": workers,
        "workflows_per_second": round(workflows / sum(r["seconds"] for r in runs), 1),
        "runs": runs,
        "claim_ms_median": round(statistics.median(c["claim_ms_median"] for c in claims), 3),
        "uses_partial_index": all(c["uses_partial_index"] for c in claims),
    }


async def run_scale(
    url: str, finished: int, waiting: int, workflows: int, workers: int, concurrency: int, rounds: int = 3
) -> dict[str, Any]:
    """The claim time and the throughput of ``workers`` worker processes on loaded tables
    against empty ones, measured in turns in ``rounds`` rounds (the order flips each round,
    so a drift in the machine's load favours neither side): the share judged is the median
    of the rounds' loaded-over-empty workflows/s."""
    empty_url = await asyncio.to_thread(_create, url, "scale_empty")
    loaded_url = await asyncio.to_thread(_create, url, "scale_loaded")
    try:
        started = time.monotonic()
        await asyncio.to_thread(fill, loaded_url, finished, waiting)
        fill_seconds = round(time.monotonic() - started, 1)
        settled = await asyncio.to_thread(wait_for_autovacuum, loaded_url)
        sides: dict[str, str] = {"empty": empty_url, "loaded": loaded_url}
        runs: dict[str, list[dict[str, Any]]] = {"empty": [], "loaded": []}
        claims: dict[str, list[dict[str, Any]]] = {"empty": [], "loaded": []}
        for round_number in range(rounds):
            order = ["empty", "loaded"] if round_number % 2 == 0 else ["loaded", "empty"]
            for side in order:
                claims[side].append(await asyncio.to_thread(claim_query_ms, sides[side]))
            for side in order:
                runs[side].append(await throughput.run_throughput(sides[side], workflows, workers, concurrency))
    finally:
        await asyncio.to_thread(_drop, url, "scale_empty")
        await asyncio.to_thread(_drop, url, "scale_loaded")
    empty, loaded = _side(runs["empty"], claims["empty"], workers), _side(runs["loaded"], claims["loaded"], workers)
    shares = [
        round(lo["workflows_per_second"] / em["workflows_per_second"], 3)
        for em, lo in zip(runs["empty"], runs["loaded"], strict=True)
    ]
    return {
        "finished_instances": finished,
        "waiting_instances": waiting,
        "rounds": rounds,
        "fill_seconds": fill_seconds,
        "autovacuum_wait_seconds": settled,
        "claim_empty": {k: empty[k] for k in ("claim_ms_median", "uses_partial_index")},
        "claim_loaded": {k: loaded[k] for k in ("claim_ms_median", "uses_partial_index")},
        "claim_delta_ms": round(loaded["claim_ms_median"] - empty["claim_ms_median"], 3),
        "throughput_empty": empty,
        "throughput_loaded": loaded,
        # each round's loaded over empty; their median is the share judged, so one round
        # disturbed by the machine's other work does not decide it
        "round_shares": shares,
        "throughput_share": round(statistics.median(shares), 3),
    }
