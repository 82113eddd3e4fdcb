"""Fault points (``KENNING_FAULTS``): the parser, and for each point a real process that
crashes exactly there while another, unarmed, finishes the work and the documented
guarantee holds."""

from __future__ import annotations

import json
from collections import Counter

import psutil
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from kenning.observability import faults
from kenning.observability.faults import CRASH_EXIT_CODE, POINTS
from kenning.storage import inbox as inbox_sql
from kenning.storage.inbox import NewEvent
from tests.relayer_support import check_outbox_invariants, insert_events, relayer_process, start_receiver, statuses
from tests.scheduler_support import TIMER_APP, spawn_scheduler
from tests.support import ProcessPool, check_invariants, eventually, executions, run_kenning

Sql = psycopg.Connection[tuple[object, ...]]


# The relayer imports its loop module when it starts serving: it gets that far (logging
# relayer.starting) before the spec is read, so it needs settings that pass until then.
NO_SERVER = ("--no-migrate", "--database-url", "postgresql://nobody@127.0.0.1:9/none")


COMMANDS = {"worker": [], "scheduler": [], "relayer": [*NO_SERVER, "--broker-url", "http://127.0.0.1:9/"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_process_with_a_bad_spec_refuses_to_start_with_one_line(command: str) -> None:
    def refused(env: dict[str, str]) -> list[str]:
        done = run_kenning([command, *COMMANDS[command]], env)
        assert done.returncode == 2, done
        return [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]

    assert refused({"KENNING_FAULTS": "step.after_comit=crash@1"}) == [
        "kenning: error: KENNING_FAULTS='step.after_comit=crash@1' is invalid: unknown fault point "
        f"'step.after_comit'; known points: {', '.join(POINTS)}; actions: {faults.ACTIONS}"
    ]
    assert refused({"KENNING_FAULTS": "step.after_commit=crash%0.5", "KENNING_FAULTS_SEED": "x"}) == [
        "kenning: error: KENNING_FAULTS_SEED='x' is invalid: expected a whole number"
    ]


CORE = "tests.apps.core"


EVENTS = "tests.apps.events"


LEASE = ("--lease-seconds", "1")


def armed(point: str) -> dict[str, str]:
    return {"KENNING_FAULTS": f"{point}=crash@1"}


def crashed_at(processes: ProcessPool, proc: psutil.Popen, point: str) -> None:
    """``proc`` died at ``point``, as armed: exit code 137 after a ``fault.fired`` line."""
    assert proc.wait(timeout=60) == CRASH_EXIT_CODE, processes.log_of(proc)
    fired = [json.loads(line) for line in processes.log_of(proc).splitlines() if '"fault.fired"' in line]
    assert [(f["point"], f["action"], f["level"]) for f in fired] == [(point, "crash", "warning")]


def history(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()


def status(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


THREE_STEPS = [
    ("step_one:1", "ActivityCompleted"),
    ("step_two:1", "ActivityCompleted"),
    ("step_three:1", "ActivityCompleted"),
]


async def run_three_steps_through_a_crash(
    point: str, database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> tuple[str, list[tuple[object, ...]], Counter[str]]:
    """three_steps in a worker armed at ``point``, finished by an unarmed one: the instance,
    its history at the crash and how often each step ran."""
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    first = processes.worker(database_url, CORE, *LEASE, env={**env, **armed(point)})
    async with Client(database=database) as client:
        started = await client.start("three_steps", value=1)
        crashed_at(processes, first, point)
        at_crash = history(sql, started.instance_id)
        assert status(sql, started.instance_id) == "running"  # its lease left to expire
        processes.worker(database_url, CORE, *LEASE, env=env)
        assert await client.result(started.instance_id, timeout=60) == 1
    assert history(sql, started.instance_id) == THREE_STEPS  # each step recorded once
    counts = executions(side_channel)
    check_invariants(sql)
    return started.instance_id, at_crash, Counter({k.split()[0]: n for k, n in counts.items()})


async def test_crash_after_an_activity_effect_runs_it_again_and_records_it_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    _, at_crash, ran = await run_three_steps_through_a_crash(
        "activity.after_effect", database, database_url, sql, processes, side_channel
    )
    assert at_crash == []  # the effect happened, its record did not
    assert ran == {"step_one": 2, "step_two": 1, "step_three": 1}  # at least once outside the database


async def test_crash_after_a_step_commit_replays_the_step_without_running_it(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    _, at_crash, ran = await run_three_steps_through_a_crash(
        "step.after_commit", database, database_url, sql, processes, side_channel
    )
    assert at_crash == THREE_STEPS[:1]
    assert ran == {"step_one": 1, "step_two": 1, "step_three": 1}  # committed: replayed, not run


async def test_crash_before_the_lease_is_released_finishes_the_run_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    _, at_crash, ran = await run_three_steps_through_a_crash(
        "instance.before_release", database, database_url, sql, processes, side_channel
    )
    # the last step's record rides in the completion's statement, which never ran
    assert at_crash == THREE_STEPS[:2]
    assert ran == {"step_one": 1, "step_two": 1, "step_three": 2}


async def test_crash_after_the_broker_answered_sends_again_with_the_same_id(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes)
    ids = await insert_events(database, 3)
    first = relayer_process(processes, database_url, receiver.url, *LEASE, env=armed("relayer.after_send"))
    crashed_at(processes, first, "relayer.after_send")
    assert receiver.accepted() == dict.fromkeys(ids, 1)  # the broker has them ...
    assert statuses(sql) == {"publishing": 3}  # ... the outbox does not know it
    relayer_process(processes, database_url, receiver.url, *LEASE)
    await eventually(lambda: statuses(sql) == {"published": 3}, timeout=60, message="published by the other relayer")
    # at least once: the same CloudEvents id again, which consumers deduplicate on
    assert receiver.accepted() == dict.fromkeys(ids, 2)
    check_outbox_invariants(sql)
    check_invariants(sql)


async def test_crash_after_a_delivery_commit_delivers_the_event_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    first = processes.worker(database_url, EVENTS, *LEASE, env=armed("delivery.after_commit"))
    async with Client(database=database) as client:
        started = await client.start("waits_for", key="k-1")
        # subscribed, and offered what the inbox held (nothing): the event comes through
        # the inbox row's own transaction, where the point is
        await eventually(
            lambda: sql.execute("SELECT checked_at IS NOT NULL FROM kenning_event_subscriptions").fetchone() == (True,),
            timeout=60,
        )
        async with database.connection() as conn:
            await inbox_sql.inbox_insert_events(
                conn, [NewEvent(source="tests", event_id="e-1", event_type="test.ping", data={"key": "k-1"})]
            )
        crashed_at(processes, first, "delivery.after_commit")
        # committed before the crash: processed, recorded, the instance runnable (or, if a
        # claim of the dying worker's raced the crash, claimed, its lease left to expire)
        assert sql.execute("SELECT status, attempts FROM kenning_inbox").fetchall() == [("processed", 1)]
        assert history(sql, started.instance_id) == [("wait_event_test.ping:1", "EventReceived")]
        assert status(sql, started.instance_id) in ("pending", "running")
        processes.worker(database_url, EVENTS, *LEASE)
        result = await client.result(started.instance_id, timeout=60)
    assert result["id"] == "e-1"
    assert history(sql, started.instance_id) == [("wait_event_test.ping:1", "EventReceived")]
    assert sql.execute("SELECT status, attempts FROM kenning_inbox").fetchall() == [("processed", 1)]
    check_invariants(sql)


async def test_crash_after_timers_fired_fires_each_once(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    processes.worker(database_url, TIMER_APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
    first = spawn_scheduler(processes, database_url, env=armed("timer.after_fire"))
    async with Client(database=database) as client:
        started = await client.start("nap", seconds=0.2)
        crashed_at(processes, first, "timer.after_fire")
        # the worker needs no scheduler to go on: the firing committed
        assert await client.result(started.instance_id, timeout=60) == "nap"
    kinds = [kind for _, kind in history(sql, started.instance_id)]
    assert kinds == ["TimerExpired", "ActivityCompleted"]
    assert executions(side_channel)[f"woke:nap {started.instance_id}"] == 1
    assert sql.execute("SELECT count(*) FROM kenning_timers").fetchone() == (0,)
    check_invariants(sql)
