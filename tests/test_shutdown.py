"""The shutdown grace period bounds a worker's exit (issue 13, item 3): after SIGTERM a
worker whose activities hang (an ``async`` one awaiting forever, a sync one sleeping in
its thread, which nothing can stop) still exits, with code 0, and leaves the instances
to another worker instead of holding them until SIGKILL."""

from __future__ import annotations

import asyncio
import signal

import psutil
import psycopg

from kenning import Client
from kenning.db import Database
from kenning_worker.shutdown import MARGIN_SECONDS
from tests.support import ProcessPool, eventually, executions

APP = "tests.apps.poison"
GRACE = 1.0


async def test_sigterm_exits_within_the_grace_period_though_activities_hang(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    # a long lease: the instances are claimable again only if the worker released them
    options = ("--shutdown-grace-seconds", str(GRACE), "--lease-seconds", "600")
    worker = processes.worker(database_url, APP, *options, env=env)
    async with Client(database=database) as client:
        await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")
        ids = [(await client.start(name)).instance_id for name in ("hung_async", "hung_sync")]
    labels = [f"hang_async {ids[0]}", f"hang_sync {ids[1]}"]
    await eventually(lambda: all(executions(side_channel)[label] == 1 for label in labels), timeout=60)

    worker.send_signal(signal.SIGTERM)
    try:  # grace + margin is the bound; the rest is slack for a loaded machine, not a timing
        code = await asyncio.to_thread(worker.wait, GRACE + MARGIN_SECONDS + 10)
    except psutil.TimeoutExpired:
        raise AssertionError("the worker did not exit after SIGTERM") from None
    assert code == 0
    log = processes.log_of(worker)
    assert '"worker.stopped"' in log and '"worker.exit_forced"' in log
    rows = sql.execute(
        "SELECT status, lease_token, available_at <= now() FROM kenning_instances WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [("pending", None, True)] * 2  # released: claimable at once, not in 600 s

    # another worker takes both over at once
    processes.worker(database_url, APP, *options, env=env)
    await eventually(lambda: all(executions(side_channel)[label] == 2 for label in labels), timeout=60)
