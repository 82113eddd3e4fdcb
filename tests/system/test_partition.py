"""A worker cut off mid-transaction (issue 33, item 2): packets dropped, no reset, while
its transaction holds instances' rows. Claims skip locked rows, so until the server ends
that session nobody takes them over, however long ago their leases expired; Kenning's own
sessions bound their idle time inside a transaction, and ``kenning why`` and the stuck
check name the backend that holds an expired lease's row meanwhile.

The cut is a blackholing proxy (``tests/tcp_proxy.py``) between one worker and the
server, which falls when the worker sends a COMMIT: the step's record is written (the
instance row locked), its commit never arrives. The server's TCP peer is the proxy, alive,
so no keepalive of the server's ends the session: only its idle-in-transaction timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.apps.takeover import SESSION_MARK
from tests.ingress_support import TcpProxy
from tests.logguard import expect_log
from tests.scheduler_support import log_events, spawn_scheduler
from tests.support import ProcessPool, check_invariants, eventually, executions, kenning_command, workers_started

APP = "tests.apps.takeover"
LEASE_SECONDS = 3.0
POLL_SECONDS = 0.2  # ProcessPool.worker's
Sql = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[TcpProxy]:
    forwarder = TcpProxy(database_url)
    await forwarder.start()
    try:
        yield forwarder
    finally:
        await forwarder.stop()


def _held(sql: Sql, ids: list[str]) -> list[str]:
    """Of ``ids``, those whose lease expired while their row is locked."""
    rows = sql.execute(
        "SELECT id FROM kenning_instances WHERE id = ANY(%s) AND lease_token IS NOT NULL AND available_at <= now()"
        " AND id NOT IN (SELECT id FROM kenning_instances WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED)",
        (ids, ids),
    ).fetchall()
    return [str(r[0]) for r in rows]


async def _blocker(sql: Sql, database_url: str, instance_id: str) -> int:
    """The backend a lock on the instance's row waits for, told by the server: a probe
    asks for the row (its wait bounded by a lock timeout) and ``pg_blocking_pids`` names
    whom it waits for."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as probe:
        await probe.execute("SET lock_timeout = '5s'")
        wait = asyncio.create_task(
            probe.execute("SELECT id FROM kenning_instances WHERE id = %s FOR UPDATE", (instance_id,))
        )
        try:
            blocking = await eventually(
                lambda: sql.execute("SELECT pg_blocking_pids(%s)", (probe.info.backend_pid,)).fetchone()[0],  # type: ignore[index]
                message="the probe waits for the row",
            )
        finally:
            with contextlib.suppress(psycopg.errors.LockNotAvailable):
                await wait
    assert len(blocking) == 1, blocking
    return int(blocking[0])


def _runs(side_channel: str, ids: list[str]) -> list[int]:
    """How often each instance's step has begun (on a loaded machine a lease may be lost
    and a step begun again before the cut: counts are compared with those at the cut)."""
    counts = executions(side_channel)
    return [counts[f"write {i}"] for i in ids]


def _owners(sql: Sql, ids: list[str]) -> dict[str, str | None]:
    rows = sql.execute("SELECT id, lease_owner, status FROM kenning_instances WHERE id = ANY(%s)", (ids,)).fetchall()
    return {str(i): (None if s == "completed" else o) for i, o, s in rows}


async def _cut_mid_commit(
    processes: ProcessPool,
    proxy: TcpProxy,
    database: Database,
    side_channel: str,
    tmp_path: Path,
    env: dict[str, str],
    survivor_url: str = "",
) -> tuple[list[str], Path]:
    """Two instances in flight on a worker reached through ``proxy``, cut as the first of
    their steps commits (another worker on ``survivor_url`` started meanwhile, if given).
    Returns the instances and the file that lets their steps end."""
    release = tmp_path / "release"
    cut = processes.worker(
        proxy.url,
        APP,
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--no-inbox",
        "--worker-id",
        "cut-off",
        env={"KENNING_TEST_SIDE_CHANNEL": side_channel, **env},
    )
    await workers_started(processes, [cut])
    # the commit (a simple query, not a word in a statement) of a step's own transaction,
    # armed before the steps begin it
    proxy.blackhole_on(b"COMMIT\x00", after=SESSION_MARK.encode())
    async with Client(database=database) as client:
        started = await asyncio.gather(*(client.start("session_step", release_file=str(release)) for _ in range(2)))
    ids = [s.instance_id for s in started]
    await eventually(lambda: all(_runs(side_channel, ids)), message="in flight")
    if survivor_url:
        survivor = processes.worker(
            survivor_url, APP, "--lease-seconds", str(LEASE_SECONDS), env={"KENNING_TEST_SIDE_CHANNEL": side_channel}
        )
        await workers_started(processes, [survivor])
    release.touch()
    await eventually(proxy.cut.is_set, message="the worker cut off at a commit")
    # the cut-off worker's own commits hang while the cut lasts, and it says so
    expect_log("database.commits_stalled", process_id="cut-off")
    return ids, release


async def test_a_worker_cut_off_mid_transaction_is_taken_over_within_a_lease(
    database: Database,
    database_url: str,
    sql: Sql,
    processes: ProcessPool,
    proxy: TcpProxy,
    side_channel: str,
    tmp_path: Path,
) -> None:
    # the default bound (10 s), which the worker caps at half its 3 s lease
    ids, _ = await _cut_mid_commit(processes, proxy, database, side_channel, tmp_path, {}, database_url)
    cut_at, at_cut = time.monotonic(), _runs(side_channel, ids)
    # README: a lost worker's instances run again within a lease and a poll interval; the
    # margin is for this loaded machine. Unbounded, they waited for the cut to heal.
    await eventually(
        lambda: all(now > then for now, then in zip(_runs(side_channel, ids), at_cut, strict=True)),
        timeout=LEASE_SECONDS + POLL_SECONDS + 10,
        message="both taken over while the cut lasts",
    )
    assert proxy.cut.is_set()
    print(f"taken over {time.monotonic() - cut_at:.1f} s after the cut")  # the figure, for the log
    await eventually(lambda: set(_owners(sql, ids).values()) == {None}, timeout=30, message="both done")
    check_invariants(sql)


async def test_why_and_the_stuck_check_name_the_backend_holding_an_expired_lease(
    database: Database,
    database_url: str,
    sql: Sql,
    processes: ProcessPool,
    proxy: TcpProxy,
    side_channel: str,
    tmp_path: Path,
) -> None:
    # the server's bound off, as before: the rows stay locked past the lease while the cut lasts
    unbounded = {"KENNING_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": "0"}
    ids, _ = await _cut_mid_commit(processes, proxy, database, side_channel, tmp_path, unbounded)
    held = await eventually(lambda: _held(sql, ids), timeout=LEASE_SECONDS + 15, message="a lease expired, locked")
    # the step whose commit was held wrote its record last; the other step's session idles
    # in its transaction too, as an activity's does while it runs
    holder = await _blocker(sql, database_url, held[0])
    why = kenning_command("why", held[0], "--json", url=database_url)
    assert why.returncode == 0, why.stderr
    told = json.loads(why.stdout)
    pid = told["locked_by"]["pid"]
    assert pid == holder and told["locked_by"]["state"] == "idle in transaction", (told, holder)
    assert f"pid {pid}" in told["way_forward"] and "lease expired" in told["way_forward"], told["way_forward"]
    text = kenning_command("why", held[0], url=database_url)
    assert f"backend pid {pid}" in text.stdout, text.stdout

    scheduler = spawn_scheduler(processes, database_url, "--stuck-check-interval", "0.2")
    # both instances' leases expired locked: the check tells of each, in no set order
    found = await eventually(
        lambda: [
            e for e in log_events(processes.log_of(scheduler), "instance.lease_locked") if e["instance_id"] == held[0]
        ],
        message="the stuck check tells",
    )
    assert found[0]["holder_pid"] == holder, found[0]
    assert found[0]["holder_state"] == "idle in transaction", found[0]
    proxy.heal()  # the worker hears its commit's answer; the instances go on
    await eventually(lambda: set(_owners(sql, ids).values()) == {None}, timeout=30, message="both done")
    check_invariants(sql)
