"""Real worker processes: races, kill -9, a stalled worker, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import psutil
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.logguard import expect_log
from tests.support import ProcessPool, check_invariants, eventually, executions

APP = "tests.apps.core"


async def test_two_worker_processes_race_for_200_instances(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    workers = [
        processes.worker(database_url, APP, "--concurrency", "16", "--log-level", "debug", env=env) for _ in range(2)
    ]

    # both are up before the burst: on a loaded machine one may take a second longer to
    # start, and the other would rightly take everything
    def both_started() -> bool:
        return all('"worker.started"' in processes.log_of(w) for w in workers)

    await eventually(both_started, timeout=60)
    async with Client(database=database) as client:
        # a burst, as a busy producer makes: both workers wake to more than either can
        # take at once (one that keeps up with a trickle of starts may rightly take all)
        started = await asyncio.gather(*(client.start("three_steps", value=n) for n in range(200)))
        ids = [s.instance_id for s in started]

        def done() -> bool:
            row = sql.execute("SELECT count(*) FROM kenning_instances WHERE status = 'completed'").fetchone()
            return row == (200,)

        await eventually(done, timeout=180, message="200 instances completed")
    counts = executions(side_channel)
    for instance_id in ids:
        for step in ("step_one", "step_two", "step_three"):
            assert counts[f"{step} {instance_id}"] == 1
    # both processes took part, and together they claimed each instance once
    claimed = [processes.log_of(w).count('"instance.claimed"') for w in workers]
    assert all(n > 0 for n in claimed) and sum(claimed) == 200, claimed
    check_invariants(sql)


async def test_killed_worker_is_finished_by_another_after_lease_expiry(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_BLOCK_FILE": str(block)}
    first = processes.worker(database_url, APP, "--lease-seconds", "1.5", env=env)
    async with Client(database=database) as client:
        started = await client.start("slow_three", value=1)
        key = f"step_two {started.instance_id}"
        await eventually(lambda: executions(side_channel)[key] == 1, timeout=60, message="step two started")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1.5", env=env)
        assert await client.result(started.instance_id, timeout=30) == 1
    counts = executions(side_channel)
    assert counts[f"step_one {started.instance_id}"] == 1  # recorded before the crash: replayed
    assert counts[key] == 2  # in flight at the crash: at-least-once
    assert counts[f"step_three {started.instance_id}"] == 1
    check_invariants(sql)


async def test_stalled_worker_cannot_write_after_takeover(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_BLOCK_FILE": str(block)}
    stale = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    async with Client(database=database) as client:
        started = await client.start("slow_three", value=2)
        key = f"step_two {started.instance_id}"
        await eventually(lambda: executions(side_channel)[key] == 1, timeout=60)
        stale.send_signal(signal.SIGSTOP)  # stalls past its lease, like a long GC pause
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        assert await client.result(started.instance_id, timeout=30) == 3
        stale.send_signal(signal.SIGCONT)  # wakes up, finishes step two, tries to record it
        await eventually(lambda: "instance.lease_lost" in processes.log_of(stale), timeout=60)
    rows = sql.execute(
        "SELECT step_id FROM kenning_history WHERE instance_id = %s ORDER BY seq", (started.instance_id,)
    ).fetchall()
    assert [r[0] for r in rows] == ["step_one:1", "step_two:1", "step_three:1"]
    assert (await Client(database=database).status(started.instance_id)).status == "completed"
    check_invariants(sql)


async def test_crash_during_compensation_is_finished_by_another_worker(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    expect_log("instance.failed", workflow="saga")
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_CRASH_IN_REFUND": "1"}
    first = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    async with Client(database=database) as client:
        started = await client.start("saga", amount=3, fail=True)
        await eventually(lambda: first.poll() is not None, timeout=60, message="worker died in refund")
        assert (await client.status(started.instance_id)).status == "compensating"
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        with pytest.raises(Exception, match="failed"):
            await client.result(started.instance_id, timeout=30)
    counts = executions(side_channel)
    assert counts[f"refund:3 {started.instance_id}"] == 2  # the crash hit it once: re-run
    assert counts[f"release_stock:sku1:2:r-sku1 {started.instance_id}"] == 1
    assert counts[f"ship {started.instance_id}"] == 1  # the workflow body was not re-run
    kinds = sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s AND kind LIKE 'Compensation%%' ORDER BY seq",
        (started.instance_id,),
    ).fetchall()
    assert kinds == [
        ("compensation:comp:2", "CompensationExecuted"),
        ("compensation:on_failure:reserve:1", "CompensationExecuted"),
    ]
    check_invariants(sql)


@pytest.mark.smoke
async def test_sigterm_releases_in_flight_instances_and_exits_zero(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
    tmp_path: Path,
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_TEST_BLOCK_FILE": str(block)}
    worker = processes.worker(database_url, APP, "--shutdown-grace-seconds", "0.5", "--lease-seconds", "60", env=env)
    async with Client(database=database) as client:
        started = await client.start("slow_three", value=1)
        await eventually(lambda: executions(side_channel)[f"step_two {started.instance_id}"] == 1, timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 15) == 0
        row = sql.execute(
            "SELECT status, lease_token FROM kenning_instances WHERE id = %s", (started.instance_id,)
        ).fetchone()
        assert row == ("pending", None)  # released: no need to wait 60 s for the lease
        block.unlink()
        processes.worker(database_url, APP, env=env)
        assert await client.result(started.instance_id, timeout=60) == 1
    check_invariants(sql)


def test_worker_cli_reports_bad_configuration(processes: ProcessPool) -> None:
    bad_url = processes.spawn(["worker", "--app", APP, "--database-url", "mysql://x/y"], name="bad-url")
    assert bad_url.wait(timeout=30) == 2
    assert "database URL must start with postgresql://" in processes.log_of(bad_url)
    bad_app = processes.spawn(
        ["worker", "--app", "no_such_module", "--no-migrate", "--database-url", "postgresql://localhost/x"],
        name="bad-app",
    )
    assert bad_app.wait(timeout=30) == 2
    assert "cannot import application module 'no_such_module'" in processes.log_of(bad_app)
    assert "Traceback" not in processes.log_of(bad_app)
    unreachable = processes.spawn(
        ["worker", "--app", APP, "--database-url", "postgresql://nobody@127.0.0.1:1/x"], name="unreachable"
    )
    assert unreachable.wait(timeout=30) == 1
    assert "database error" in processes.log_of(unreachable)


def test_psutil_is_real() -> None:
    assert psutil.Process().pid > 0
