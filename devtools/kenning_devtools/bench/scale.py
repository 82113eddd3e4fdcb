"""Scale: the claim query and throughput with many finished and waiting instances present."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from kenning_devtools.bench.limits import CLAIM


def fill(url: str, finished: int, waiting: int) -> None:
    """Bulk-load finished instances (with history) and instances waiting on events/timers."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, result, finished_at, run_count) "
            "SELECT 'done-' || g, 'bench_old', 'completed', '{\"result\": 1}', now(), 1 "
            "FROM generate_series(1, %s) g",
            (finished,),
        )
        conn.execute(
            "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload) "
            "SELECT 'done-' || g, 'bump:1', 'ActivityCompleted', 'bump', '{\"result\": 1}' "
            "FROM generate_series(1, %s) g",
            (finished,),
        )
        conn.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, run_count) "
            "SELECT 'wait-' || g, 'bench_old', CASE WHEN g %% 2 = 0 THEN 'waiting_for_event' "
            "ELSE 'waiting_for_timer' END, 1 FROM generate_series(1, %s) g",
            (waiting,),
        )
        conn.execute(
            # checked: in steady state a worker checks each subscription for earlier events
            # once, right after it is made; 50,000 unchecked ones would be a catch-up burst
            "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, checked_at) "
            "SELECT 'wait-' || g, 'wait_event_x:1', 'wait_event:x', 'x', now() FROM generate_series(2, %s, 2) g",
            (waiting,),
        )
        conn.execute(
            "INSERT INTO kenning_timers (instance_id, step_id, step_name, due_at) "
            "SELECT 'wait-' || g, 'wait_timer:1', 'wait_timer', now() + interval '30 days' "
            "FROM generate_series(1, %s, 2) g",
            (waiting,),
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
                {"owner": "probe", "names": ["bench_three"], "limit": 10, "lease_seconds": 30.0, "now": None},
            ).fetchall()
            conn.rollback()
            timings.append((time.perf_counter() - started) * 1000)
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + CLAIM,
                {"owner": "probe", "names": ["bench_three"], "limit": 10, "lease_seconds": 30.0, "now": None},
            ).fetchall()
        )
        conn.rollback()
    timings.sort()
    return {"claim_ms_median": round(timings[len(timings) // 2], 3), "uses_partial_index": "claimable" in plan}
