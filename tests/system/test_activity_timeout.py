"""Activity timeouts (issue 13, item 3): an attempt that never ends fails by timeout.

Before, an activity awaiting forever (or looping in ``time.sleep``) held its instance
``running`` for ever, its lease renewed by the heartbeat.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest

from kenning import ActivityTimeoutError, Client, WorkflowFailedError, serialization
from kenning.db import Database
from tests.apps import limits
from tests.logguard import LogGuard, expect_log
from tests.support import executions, run_kenning, running_worker

Sql = psycopg.Connection[tuple[object, ...]]


TIMED_OUT = "RetryExhaustedError<-ActivityTimeoutError:True"


async def run_times_out(
    database: Database, log_guard: LogGuard, kind: str, **settings: Any
) -> tuple[str, Any, list[Any]]:
    with log_guard.capture() as logs:
        async with Client(database=database) as client, running_worker(database, limits.app, **settings):
            started = await client.start(limits.times_out, kind=kind)
            result = await client.result(started.instance_id, timeout=15)
    return started.instance_id, result, [e for e in logs if e["event"] == "activity.timed_out"]


async def test_an_async_activity_that_hangs_is_cancelled_and_retried_per_policy(
    database: Database, side_channel: str, log_guard: LogGuard
) -> None:
    iid, result, timed_out = await run_times_out(database, log_guard, "async")
    assert result == TIMED_OUT  # the workflow caught it: RetryExhaustedError, caused by the timeout
    assert executions(side_channel)[f"hangs {iid}"] == 2  # TWICE: two attempts, both timed out
    assert [(e["step"], e["attempt"], e["timeout"], e["level"]) for e in timed_out] == [
        ("hangs:1", 1, 0.3, "warning"),
        ("hangs:1", 2, 0.3, "warning"),
    ]


async def test_a_sync_activity_in_time_sleep_is_abandoned_in_its_thread(
    database: Database, side_channel: str, log_guard: LogGuard
) -> None:
    iid, result, timed_out = await run_times_out(database, log_guard, "sync")
    assert result == TIMED_OUT
    assert executions(side_channel)[f"sleeps {iid}"] == 2
    assert len(timed_out) == 2


async def test_the_worker_default_applies_to_activities_without_their_own(
    database: Database, side_channel: str, log_guard: LogGuard
) -> None:
    iid, result, timed_out = await run_times_out(database, log_guard, "default", activity_timeout=0.3)
    assert result == TIMED_OUT
    assert executions(side_channel)[f"hangs_without_own_timeout {iid}"] == 2
    assert {e["timeout"] for e in timed_out} == {0.3}


async def test_the_activitys_own_timeout_error_is_not_an_activity_timeout(
    database: Database, side_channel: str, log_guard: LogGuard
) -> None:
    iid, result, timed_out = await run_times_out(database, log_guard, "own")
    assert result == "RetryExhaustedError<-TimeoutError:False"
    assert executions(side_channel)[f"raises_own_timeout {iid}"] == 2
    assert timed_out == []


async def test_uncaught_it_fails_the_instance_and_keeps_its_class_on_replay(
    database: Database, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="times_out_uncaught")
    async with Client(database=database) as client, running_worker(database, limits.app):
        started = await client.start(limits.times_out_uncaught)
        with pytest.raises(
            WorkflowFailedError, match=r"failed after 2 attempts: activity hangs timed out after 0\.3 s"
        ):
            await client.result(started.instance_id, timeout=15)
    row = sql.execute(
        "SELECT payload FROM kenning_history WHERE instance_id = %s AND step_id = 'hangs:1'", (started.instance_id,)
    ).fetchone()
    assert row is not None
    replayed = serialization.decode_error(row[0])  # type: ignore[arg-type]
    assert isinstance(replayed.__cause__, ActivityTimeoutError)


def test_the_worker_flag_refuses_a_timeout_that_is_not_positive() -> None:
    done = run_kenning(
        ["worker", "--activity-timeout", "0", "--app", "tests.apps.limits"], {"PATH": os.environ.get("PATH", "")}
    )
    assert done.returncode == 2
    assert "argument --activity-timeout: invalid positive_float value: '0'" in done.stderr
