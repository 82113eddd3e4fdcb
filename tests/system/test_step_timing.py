"""A step's attempts, start and run time (migration 0007): recorded with the step by a real
worker, for activities that succeed or give up and for compensations, and shown by the
console's timeline and ``kenning instances show``; steps that do not run (a received event, a timer) have none, and a
row recorded before 0007 falls back to the record before it."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest

from kenning import Client
from kenning_console.timeline import timeline
from tests.apps.console import WEIGH_SECONDS
from tests.console_support import became, console_ready, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, eventually, kenning_command

APP = "tests.apps.console"

Sql = psycopg.Connection[tuple[object, ...]]


def timing(sql: Sql, instance_id: str) -> dict[str, tuple[Any, ...]]:
    """Each history row's ``(kind, attempts, started_at, run_seconds, created_at)``, by step id."""
    rows = sql.execute(
        "SELECT step_id, kind, attempts, started_at, run_seconds, created_at FROM kenning_history "
        "WHERE instance_id = %s ORDER BY seq",
        [instance_id],
    ).fetchall()
    return {str(row[0]): tuple(row[1:]) for row in rows}


def timeline_item(page: str, name: str) -> str:
    """The markup of the step ``name`` in an instance page's timeline."""
    item = page[page.index(f"<strong>{name}</strong>") :]
    return item[: item.index("</li>")]


def backing_off(sql: Sql, instance_id: str) -> bool:
    row = sql.execute(
        "SELECT status = 'pending' AND attempts ? 'charge:1' AND available_at > now() + interval '1 minute' "
        "FROM kenning_instances WHERE id = %s",
        [instance_id],
    ).fetchone()
    return row == (True,)


async def test_a_worker_records_each_runs_attempts_start_and_time_and_the_console_shows_them(
    processes: ProcessPool, database_url: str, sql: Sql, blocker: Path
) -> None:
    expect_log("instance.failed", workflow="shop.fulfil")
    blocker.touch()  # deliver fails both of its attempts
    processes.worker(database_url, APP)
    url, console = spawn_console(processes, database_url, app=APP)
    await console_ready(url, console)
    async with Client(database_url) as kenning:
        weighed = (await kenning.start("shop.weigh", parcel="p-1")).instance_id
        failed = (await kenning.start("shop.fulfil", order_id="o-1")).instance_id
        ordered = (await kenning.start("shop.order", order_id="o-2", quantity=1)).instance_id
        charging = (await kenning.start("shop.charge", order_id="o-3")).instance_id
        await became(sql, weighed, "completed")
        await became(sql, failed, "failed")
        await eventually(lambda: "reserve_stock:1" in timing(sql, ordered), message="the stock reserved")
        assert await kenning.cancel(ordered)
        await became(sql, ordered, "cancelled")
        await eventually(lambda: backing_off(sql, charging), message="the charge released for its back-off")

    # the third attempt succeeded: three counted, its own start and run time
    kind, attempts, started_at, run_seconds, created_at = timing(sql, weighed)["weigh:1"]
    assert (kind, attempts) == ("ActivityCompleted", 3)
    assert WEIGH_SECONDS - 0.01 <= run_seconds < WEIGH_SECONDS + 5  # the loop may wake a hair early
    # recorded after it ended (same machine, so one clock; microseconds of rounding allowed)
    assert started_at + timedelta(seconds=run_seconds) <= created_at + timedelta(milliseconds=1)

    steps = timing(sql, failed)
    assert steps["prepare:1"][:2] == ("ActivityCompleted", 1)
    assert steps["deliver:1"][:2] == ("ActivityFailed", 2)  # gave up after its two
    assert steps["deliver:1"][2] is not None and steps["deliver:1"][3] is not None

    steps = timing(sql, ordered)
    assert steps["reserve_stock:1"][:2] == ("ActivityCompleted", 1)
    (compensation,) = [row for step, row in steps.items() if step.startswith("compensation:")]
    assert compensation[:2] == ("CompensationExecuted", 1)
    assert compensation[2] is not None and compensation[3] is not None

    # the operator's command shows the same, in its table and in its JSON
    human = kenning_command("instances", "show", weighed, url=database_url).stdout
    (weigh_line,) = [line for line in human.splitlines() if "weigh:1" in line]
    assert weigh_line.split()[-3:] == ["3", f"{run_seconds:.3f}", "s"]
    (detail,) = json.loads(kenning_command("instances", "show", weighed, "--json", url=database_url).stdout)["history"]
    assert (detail["attempts"], detail["run_seconds"]) == (3, run_seconds)
    assert datetime.fromisoformat(detail["started_at"]) == started_at

    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        page = (await client.get(f"/instances/{weighed}")).text
    item = timeline_item(page, "weigh")
    assert "3 attempts" in item
    assert "retrying" not in page  # its failed attempts were cleared by its record

    shown = float(item.split("took ", 1)[1].split(" s", 1)[0])
    assert shown == pytest.approx(run_seconds, abs=0.001)
    shown_start = re.search(r'started <time datetime="([^"]+)"', item)
    assert shown_start is not None and datetime.fromisoformat(shown_start[1]) == started_at

    # a step between attempts has no record yet: the timeline shows it retrying, and when next
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        page = (await client.get(f"/instances/{charging}")).text
    item = timeline_item(page, "charge")
    assert "retrying" in item and "1 attempt " in item and "failing since" in item
    assert "last error: RuntimeError(&#39;the card for o-3 was declined&#39;)" in item
    due = sql.execute("SELECT available_at FROM kenning_instances WHERE id = %s", [charging]).fetchone()
    next_attempt = re.search(r'next attempt <time datetime="([^"]+)"', item)
    assert due is not None and next_attempt is not None and datetime.fromisoformat(next_attempt[1]) == due[0]


def _row(kind: str, at: datetime, **timed: Any) -> SimpleNamespace:
    values = {"attempts": None, "started_at": None, "run_seconds": None, **timed}
    return SimpleNamespace(
        seq=0, step_id=f"{kind}:1", kind=kind, step_name=kind, payload={}, binary=False, created_at=at, **values
    )


def test_the_timeline_takes_a_measured_step_as_measured_and_falls_back_for_the_rest() -> None:
    began = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    instance = SimpleNamespace(started_at=began, created_at=began, attempts={})
    measured = _row(
        "ActivityCompleted",
        began + timedelta(seconds=10),  # written late (a deferred record): the record time is not the end
        attempts=3,
        started_at=began + timedelta(seconds=2),
        run_seconds=0.25,
    )
    old = _row("ActivityCompleted", began + timedelta(seconds=12))  # recorded before 0007
    event = _row("EventReceived", began + timedelta(seconds=15))
    items = timeline(instance=instance, history=[measured, old, event], compensations=[], waits=[], timers=[], sent=[])
    assert [(i.started, i.duration, i.attempts) for i in items] == [
        (began + timedelta(seconds=2), 0.25, 3),
        (began + timedelta(seconds=10), 2.0, None),  # from the record before it
        (began + timedelta(seconds=12), 3.0, None),
    ]


def test_a_step_being_retried_is_shown_with_its_count_error_and_next_attempt() -> None:
    began = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    failing = {"attempts": 2, "first_failed_at": "2026-12-03T12:00:05+00:00", "last_error": "RuntimeError('no')"}
    done = _row("ActivityCompleted", began + timedelta(seconds=1), attempts=1, started_at=began, run_seconds=0.5)
    done.step_id = "reserve:1"
    compensation = SimpleNamespace(comp_id="c-1", function_name="refund", args=[], kwargs={}, created_at=began)
    instance = SimpleNamespace(
        started_at=began,
        created_at=began,
        status="pending",
        available_at=began + timedelta(minutes=5),
        attempts={"charge:1": failing, "reserve:1": {"attempts": 9}},  # a recorded step's entry: not retrying
    )
    items = timeline(instance=instance, history=[done], compensations=[], waits=[], timers=[], sent=[])
    assert [(i.kind, i.name, i.outcome, i.attempts, i.last_error, i.at, i.due_at) for i in items] == [
        ("activity", "ActivityCompleted", "completed", 1, "", began + timedelta(seconds=1), None),
        (
            "activity",
            "charge",
            "retrying",
            2,
            "RuntimeError('no')",
            began + timedelta(seconds=5),
            began + timedelta(minutes=5),
        ),
    ]
    # a compensation retried inline while the saga runs: named by its function, no next attempt known
    instance.status, instance.attempts = "compensating", {"compensation:c-1": failing}
    items = timeline(instance=instance, history=[], compensations=[compensation], waits=[], timers=[], sent=[])
    retrying = [i for i in items if i.outcome == "retrying"]
    assert [(i.kind, i.name, i.attempts, i.due_at) for i in retrying] == [("compensation", "refund", 2, None)]
    assert [i.outcome for i in items] == ["retrying"]  # not also listed as registered, not run
