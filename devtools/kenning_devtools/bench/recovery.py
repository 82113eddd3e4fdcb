"""Recovery: a worker with N instances in flight is killed with kill -9; an idle worker
takes them over. The time from the kill until the last completed, beside the activity's
run time and the lease: the README's bound is lease + poll + run time (issue 25). Taken
over one at a time, as before, it was about N x run time."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

from kenning.client import Client
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.recoveryflows import HOLD, bench_recovery

APP = "kenning_devtools.bench.recoveryflows"
DOOMED, SURVIVOR = "bench-doomed", "bench-survivor"
POLL_SECONDS = 1.0  # the workers' default --poll-interval, passed so the report states it
OBSERVE_SECONDS = 0.02  # how often completion is read: the recovery time's resolution
Conn = psycopg.AsyncConnection[DictRow]

# The leases ``owner`` holds on the instances; ``expiries`` 1 once a heartbeat renewed them
# all in one statement (as it does every lease / 3 s for everything a worker runs).
_LEASES = """
SELECT count(*) AS held, count(DISTINCT available_at) AS expiries, max(available_at) AS expiry,
       CAST(extract(epoch FROM max(available_at) - now()) AS float8) AS lease_left
FROM kenning_instances
WHERE id = ANY(%(ids)s) AND lease_owner = %(owner)s AND status = 'running' AND available_at > now()
"""
_ENDED = """
SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status IN ('failed', 'cancelled')) AS ended_otherwise
FROM kenning_instances WHERE id = ANY(%(ids)s)
"""
# A claim stamps claimed_at with its transaction's now(): the instances one claim
# statement took share it, so each group is one claim pass.
_TAKEOVER_CLAIMS = """
SELECT CAST(extract(epoch FROM claimed_at - %(expiry)s) AS float8) AS after_expiry, count(*) AS instances
FROM kenning_instances WHERE id = ANY(%(ids)s) AND run_count >= 2
GROUP BY claimed_at ORDER BY claimed_at
"""
_RUN_COUNTS = """
SELECT count(*) FILTER (WHERE run_count >= 2) AS taken_over, max(run_count) AS most_runs
FROM kenning_instances WHERE id = ANY(%(ids)s)
"""
# the activity's recorded run time (migration 0007): the re-runs', the ones that completed
_RUN_SECONDS = "SELECT run_seconds FROM kenning_history WHERE instance_id = ANY(%(ids)s) AND run_seconds IS NOT NULL"


def _worker(worker_id: str, instances: int, lease: float) -> tuple[list[str], str]:
    args = ["worker", "--app", APP, "--no-migrate", "--worker-id", worker_id, "--concurrency", str(instances)]
    args += ["--lease-seconds", str(lease), "--poll-interval", str(POLL_SECONDS)]
    return args, "worker.started"


async def _one(conn: Conn, query: str, params: dict[str, Any]) -> DictRow:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    if row is None:
        raise RuntimeError("an aggregate returned no row")
    return row


async def _until(conn: Conn, query: str, params: dict[str, Any], done: Any, what: str, timeout: float) -> DictRow:
    """Read ``query`` every OBSERVE_SECONDS until ``done(row)``; a clear error after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        row = await _one(conn, query, params)
        if done(row):
            return row
        if time.monotonic() > deadline:
            raise TimeoutError(f"recovery: {what} not seen within {timeout:.0f} s (last: {dict(row)})")
        await asyncio.sleep(OBSERVE_SECONDS)


async def _finished(conn: Conn, ids: list[str], timeout: float) -> None:
    def ended(row: DictRow) -> bool:
        if row["ended_otherwise"]:
            raise RuntimeError(f"recovery: {row['ended_otherwise']} instances failed or were cancelled")
        return bool(row["completed"] == len(ids))

    await _until(conn, _ENDED, {"ids": ids}, ended, "every instance completed", timeout)


async def run_recovery(url: str, instances: int, activity_seconds: float, lease_seconds: float) -> dict[str, Any]:
    """Worker A runs ``instances`` instances of an activity that lasts until A dies; once A
    holds all their leases and one heartbeat has renewed them together (how a worker's
    leases stand between heartbeats, but for the instances claimed since the last one),
    worker B starts idle and A is killed with SIGKILL. B runs each for ``activity_seconds``.
    Measured from the kill to the last completion; the claims' own timestamps say how many
    B took over in one pass."""
    with fleet(url) as running:
        doomed = running.spawn(*_worker(DOOMED, instances, lease_seconds), env={HOLD: "1"})
        async with Client(url) as client:
            started = await asyncio.gather(
                *(client.start(bench_recovery, seconds=activity_seconds) for _ in range(instances))
            )
        ids = [s.instance_id for s in started]
        async with await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row) as conn:
            held = {"ids": ids, "owner": DOOMED}
            await _until(conn, _LEASES, held, lambda r: r["held"] == instances, "every lease held by A", 60)
            running.spawn(*_worker(SURVIVOR, instances, lease_seconds))
            leases = await _until(
                conn, _LEASES, held, lambda r: r["held"] == instances and r["expiries"] == 1, "one expiry", 60
            )
            doomed.kill()
            killed = time.monotonic()
            doomed.wait(timeout=10)
            # one at a time would take about lease + N x run time: allow half as long again
            await _finished(conn, ids, timeout=lease_seconds + 1.5 * instances * activity_seconds + 60)
            recovery = time.monotonic() - killed
            passes = await (await conn.execute(_TAKEOVER_CLAIMS, {"ids": ids, "expiry": leases["expiry"]})).fetchall()
            runs = await _one(conn, _RUN_COUNTS, {"ids": ids})
            run_seconds = [r["run_seconds"] for r in await (await conn.execute(_RUN_SECONDS, {"ids": ids})).fetchall()]
    return summary(
        instances=instances,
        activity_seconds=activity_seconds,
        lease_seconds=lease_seconds,
        lease_left=float(leases["lease_left"]),
        recovery=recovery,
        passes=[(float(p["after_expiry"]), int(p["instances"])) for p in passes],
        taken_over=int(runs["taken_over"]),
        most_runs=int(runs["most_runs"]),
        run_seconds=run_seconds,
    )


def summary(
    *,
    instances: int,
    activity_seconds: float,
    lease_seconds: float,
    lease_left: float,
    recovery: float,
    passes: list[tuple[float, int]],
    taken_over: int,
    most_runs: int,
    run_seconds: list[float],
) -> dict[str, Any]:
    """The section's report from what was read; ``passes`` are (seconds after A's leases
    expired, instances taken) per claim pass of the takeover, in order."""
    bound = lease_seconds + POLL_SECONDS + activity_seconds
    return {
        "instances": instances,
        "activity_seconds": activity_seconds,
        "lease_seconds": lease_seconds,
        "poll_seconds": POLL_SECONDS,
        "lease_left_at_kill_seconds": round(lease_left, 3),
        "recovery_seconds": round(recovery, 3),
        # after the lease ran out: about one run time when taken over together
        "after_expiry_seconds": round(recovery - lease_left, 3),
        "bound_seconds": bound,
        "within_bound": recovery <= bound,
        "recovery_over_lease_and_run": round(recovery / (lease_seconds + activity_seconds), 3),
        "first_takeover_after_expiry_seconds": round(passes[0][0], 3) if passes else None,
        "claim_passes": [n for _, n in passes],
        "taken_over_at_once": passes[0][1] if passes else 0,
        "taken_over": taken_over,
        "most_runs": most_runs,
        "run_seconds_median": round(statistics.median(run_seconds), 3) if run_seconds else None,
        "run_seconds_max": round(max(run_seconds), 3) if run_seconds else None,
        # what the one-at-a-time takeover before issue 25 would have cost: each waited for
        # the one before it to end
        "one_at_a_time_seconds": round(lease_left + instances * activity_seconds, 1),
    }
