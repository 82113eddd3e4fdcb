"""Child workflows through real worker processes (issue 19, part 1): a parent gathers 50
children over two workers, one of them killed mid-run, with exactly one child per start
step; a cancelled parent cancels its ``cancel`` children (their compensations run) and
leaves its ``abandon`` ones; a failed child fails its parent, whose compensations run; a
child of a queued workflow runs in its queue. ``kenning instances show`` lists a parent's
children and a child's parent. The tests that kill no worker share one database and one
pair of workers (``shared``): starting them is most of a test's time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import tests.apps.children  # noqa: F401 - registers the workflows the client starts
from kenning import Client
from kenning.db import Database, connect
from kenning.storage import progress as progress_sql
from kenning.storage import retention as retention_sql
from kenning.storage import subscriptions as subscriptions_sql
from tests import invariants
from tests.ingress_support import cloned_database
from tests.logguard import LogGuard, expect_log
from tests.support import ProcessPool, check_invariants, eventually, executions, kenning_command, workers_started

APP = "tests.apps.children"
Sql = psycopg.Connection[tuple[object, ...]]
# a short lease, so the killed worker's instances are taken over quickly
WORKER_OPTIONS = ("--lease-seconds", "3", "--concurrency", "16", "--inbox-retry-seconds", "0.2")


def _workers(processes: ProcessPool, database_url: str, side_channel: str, count: int) -> list[psutil.Popen]:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    return [processes.worker(database_url, APP, *WORKER_OPTIONS, env=env) for _ in range(count)]


# ------------------------------------------------------------------ the shared workers


@dataclass(frozen=True)
class Shared:
    """Two workers on a database of their own, for every test of the module that kills none."""

    url: str
    side_channel: str
    logs: list[Path]


@pytest.fixture(scope="module")
def shared_workers(
    pg_server_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shared]:
    folder = tmp_path_factory.mktemp("children")
    side_channel = str(folder / "executions.log")
    Path(side_channel).touch()
    with cloned_database(pg_server_url, template_database) as url:
        pool = ProcessPool(str(folder))
        try:
            workers = _workers(pool, url, side_channel, 2)
            deadline = time.monotonic() + 60
            while not all('"worker.started"' in pool.log_of(w) for w in workers):
                assert time.monotonic() < deadline, "shared workers did not start"
                time.sleep(0.1)
            yield Shared(url, side_channel, [path for _, path in pool.procs])
        finally:
            pool.stop_all()
        # what they logged after the last test: checked as a test's lines are
        guard = LogGuard()
        for _, path in pool.procs:
            guard.watch_text(path.stem, _tail(path, _read_up_to.get(path, 0)))
        problems = guard.problems()
        assert not problems, "\n".join(problems[:30])


_read_up_to: dict[Path, int] = {}  # how far the tests have read each shared worker's log


def _tail(path: Path, offset: int) -> str:
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


@pytest.fixture
def shared(shared_workers: Shared, log_guard: LogGuard) -> Iterator[Shared]:
    """The shared workers; what they log during the test is the test's (its log guard)."""
    yield shared_workers
    for path in shared_workers.logs:
        with open(path, "rb") as log:
            log.seek(_read_up_to.get(path, 0))
            read = log.read()
        read = read[: read.rfind(b"\n") + 1]  # whole lines: the rest is the next test's
        _read_up_to[path] = _read_up_to.get(path, 0) + len(read)
        text = read.decode(errors="replace")
        log_guard.watch_text(path.stem, text)


def _logged(shared: Shared, event: str, instance_id: str) -> bool:
    """Whether a shared worker logged ``event`` for the instance (so it is this test's line)."""
    for path in shared.logs:
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' in line and instance_id in line:
                record: dict[str, Any] = json.loads(line)
                if record.get("event") == event and record.get("instance_id") == instance_id:
                    return True
    return False


@pytest.fixture
async def shared_database(shared: Shared) -> AsyncIterator[Database]:
    db = connect(shared.url)
    yield db
    await db.dispose()


@pytest.fixture
def shared_sql(shared: Shared) -> Iterator[Sql]:
    with psycopg.connect(shared.url, autocommit=True) as conn:
        yield conn


async def _inbox_drained(sql: Sql) -> None:
    """Wait until the inbox holds nothing pending (the last ends' events delivered)."""

    def drained() -> bool:
        row = sql.execute("SELECT count(*) FROM kenning_inbox WHERE status = 'pending'").fetchone()
        return row is not None and row[0] == 0

    await eventually(drained, timeout=30, message="inbox drained")


def _status(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


def _children(sql: Sql, parent_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT id, status, on_parent_cancel FROM kenning_instances WHERE parent_id = %s ORDER BY created_at",
        (parent_id,),
    ).fetchall()


async def test_fifty_children_over_two_workers_one_killed_each_start_one_child(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    workers = _workers(processes, database_url, side_channel, 2)
    await workers_started(processes, workers)
    async with Client(database=database) as client:
        parent = (await client.start("fan_out_children", count=50)).instance_id
        # kill -9 a worker once the parent is well into its starts (mid-run, whatever it holds)
        await eventually(lambda: len(_children(sql, parent)) >= 15, timeout=30, message="children starting")
        workers[0].kill()
        workers[0].wait(timeout=10)
        replacement = _workers(processes, database_url, side_channel, 1)
        await workers_started(processes, replacement)
        result = await asyncio.wait_for(client.result(parent), timeout=60)
    assert result == sum(n * n for n in range(1, 51))
    children = _children(sql, parent)
    assert len(children) == 50 and {c[1] for c in children} == {"completed"}
    # each start step names exactly one child, and each child is named by one step
    steps = sql.execute(
        "SELECT h.step_id, h.payload ->> 'child_id', c.parent_step FROM kenning_history AS h "
        "LEFT JOIN kenning_instances AS c ON c.id = h.payload ->> 'child_id' "
        "WHERE h.instance_id = %s AND h.kind = 'ChildStarted' ORDER BY h.seq",
        (parent,),
    ).fetchall()
    assert len(steps) == 50 and len({s[1] for s in steps}) == 50
    assert all(step_id == parent_step for step_id, _, parent_step in steps)
    await _inbox_drained(sql)
    check_invariants(sql)


async def test_a_cancelled_parent_cancels_its_children_and_abandons_the_others(
    shared: Shared, shared_database: Database, shared_sql: Sql
) -> None:
    sql, side_channel = shared_sql, shared.side_channel
    async with Client(database=shared_database) as client:
        parent = (await client.start("parent_of_waiters", cancelled=6, abandoned=2)).instance_id
        await eventually(
            lambda: len([c for c in _children(sql, parent) if c[1] == "waiting_for_event"]) == 8,
            timeout=30,
            message="every child waiting",
        )
        # on its first child, holding no worker (its suspension may commit just after the last child's)
        await eventually(lambda: _status(sql, parent) == "waiting_for_event", timeout=30, message="parent waiting")
        assert await client.cancel(parent)
        await eventually(lambda: _status(sql, parent) == "cancelled", timeout=30, message="parent cancelled")
        await eventually(
            lambda: sorted(str(c[1]) for c in _children(sql, parent)) == ["cancelled"] * 6 + ["waiting_for_event"] * 2,
            timeout=30,
            message="cancel children cancelled, abandoned ones still waiting",
        )
    children = _children(sql, parent)
    undone = executions(side_channel)
    assert undone[f"undo:parent {parent}"] == 1
    for child_id, status, policy in children:
        assert undone[f"undo:child{_n(sql, str(child_id))} {child_id}"] == (1 if policy == "cancel" else 0), child_id
        assert (status == "cancelled") == (policy == "cancel")
    await _inbox_drained(sql)
    # the cancelled children's ends reached a parent that no longer waits: no false alarm
    assert _child_ends_without_receiver(sql, parent) == []
    check_invariants(sql)


def _child_ends_without_receiver(sql: Sql, parent_id: str) -> list[tuple[object, ...]]:
    """The ends of ``parent_id``'s children the inbox marked "no receiver" (counted in
    kenning_events_no_receiver_total and logged as a warning with them)."""
    return sql.execute(
        "SELECT x.event_id, x.status FROM kenning_inbox AS x JOIN kenning_instances AS c ON c.id = x.event_id "
        "WHERE x.source = 'kenning.children' AND x.event_type = 'kenning.child.finished' AND c.parent_id = %s "
        "AND x.no_receiver",
        (parent_id,),
    ).fetchall()


async def test_children_ending_before_their_parent_waits_are_no_events_without_a_receiver(
    shared: Shared, shared_database: Database, shared_sql: Sql
) -> None:
    # fan-out: the parent waits for its first child while the others end; it takes each
    # later child's end when it comes to it (after that child finished), and none of those
    # ends is the "no receiver" meant to catch a misspelled event type (issue 38, item 3)
    async with Client(database=shared_database) as client:
        parent = (await client.start("fan_out_children", count=8)).instance_id
        assert await client.result(parent, timeout=60) == sum(n * n for n in range(1, 9))
    await _inbox_drained(shared_sql)
    told = shared_sql.execute(
        "SELECT count(*) FROM kenning_inbox AS x JOIN kenning_instances AS c ON c.id = x.event_id "
        "WHERE x.source = 'kenning.children' AND c.parent_id = %s AND x.status = 'processed'",
        (parent,),
    ).fetchone()
    assert told is not None and told[0] == 8  # every child's end was told, and processed
    assert _child_ends_without_receiver(shared_sql, parent) == []
    check_invariants(shared_sql)


def _n(sql: Sql, instance_id: str) -> int:
    row = sql.execute("SELECT input ->> 'n' FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row is not None
    return int(str(row[0]))


async def test_a_failed_child_fails_its_parent_whose_saga_undoes(
    shared: Shared, shared_database: Database, shared_sql: Sql
) -> None:
    sql, side_channel, database_url = shared_sql, shared.side_channel, shared.url
    async with Client(database=shared_database) as client:
        parent = (await client.start("parent_of_failure")).instance_id
        child = f"{parent}-only-child"
        expect_log("instance.failed", instance_id=child)
        expect_log("instance.failed", instance_id=parent)
        await eventually(lambda: _status(sql, parent) == "failed", timeout=30, message="parent failed")
        # logged after their commits: wait, so the lines are this test's, not the next one's
        await eventually(
            lambda: _logged(shared, "instance.failed", child) and _logged(shared, "instance.failed", parent),
            timeout=10,
            message="failures logged",
        )
    assert _status(sql, child) == "failed"
    error = sql.execute("SELECT error FROM kenning_instances WHERE id = %s", (parent,)).fetchone()
    assert error is not None and isinstance(error[0], dict)
    assert error[0]["type"] == "kenning.errors.ChildWorkflowFailed"
    assert error[0]["args"][:2] == [child, "failed"] and "the child refuses" in error[0]["message"]
    undone = executions(side_channel)
    assert undone[f"undo:child {child}"] == 1 and undone[f"undo:parent {parent}"] == 1
    # the operator's view: the parent lists its child, the child names its parent
    shown = kenning_command("instances", "show", parent, url=database_url)
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.endswith(" start_child:child_failing:1  cancel")]
    assert line.split()[-4:] == ["child_failing", "failed", "start_child:child_failing:1", "cancel"], line
    text = kenning_command("instances", "show", child, url=database_url)
    assert text.returncode == 0 and parent in text.stdout, text.stdout
    await _inbox_drained(sql)
    check_invariants(sql)


async def test_children_results_awaited_together_in_one_gather_come_back_in_order(
    shared: Shared, shared_database: Database, shared_sql: Sql
) -> None:
    # asyncio.gather over several result() calls: the first that must wait suspends the
    # parent while the others are still in flight; each later run replays them all
    async with Client(database=shared_database) as client:
        parent = (await client.start("gather_children", count=8)).instance_id
        assert await client.result(parent, timeout=60) == [n * n for n in range(1, 9)]
    children = _children(shared_sql, parent)
    assert [status for _, status, _ in children] == ["completed"] * 8
    ran = executions(shared.side_channel)
    assert [ran[f"square {child}"] for child, _, _ in children] == [1] * 8  # each child's step once
    await _inbox_drained(shared_sql)
    check_invariants(shared_sql)


def _row(sql: Sql, instance_id: str, workflow: str, status: str, **columns: object) -> None:
    names = ["id", "workflow_name", "source_hash", "status", "input", *columns]
    values = [instance_id, workflow, "h", status, "{}", *columns.values()]
    sql.execute(f"INSERT INTO kenning_instances ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})", values)


async def test_the_stuck_check_wakes_a_parent_whose_child_ended_untold_and_retention_keeps_the_child(
    database: Database, sql: Sql
) -> None:
    """A child parked by the claim (crash loop) tells no parent: the stuck check makes the
    waiting parent runnable (its replay takes the child's end); and a finished child of an
    unfinished parent is kept by retention, however old."""
    sql.execute(
        "INSERT INTO kenning_workflow_definitions (workflow_name, source_hash, source, retention_seconds) "
        "VALUES ('fan_out_children', 'h', '', 1), ('child_square', 'h', '', 1)"
    )
    _row(sql, "p", "fan_out_children", "waiting_for_event", run_count=1)
    _row(
        sql,
        "c",
        "child_square",
        "failed",
        parent_id="p",
        parent_step="start_child:child_square:1",
        on_parent_cancel="cancel",
        finished_at="2000-01-01T00:00:00Z",
    )
    _row(sql, "waiting", "fan_out_children", "waiting_for_event", run_count=1)
    _row(
        sql,
        "busy",
        "child_square",
        "running",
        parent_id="waiting",
        parent_step="start_child:child_square:1",
        on_parent_cancel="cancel",
        lease_token="7f0e7a4e-0d2d-4d5b-9f3b-1c1a7a0b0c0d",
        available_at="2100-01-01Z",
    )
    for parent, child in (("p", "c"), ("waiting", "busy")):
        sql.execute(
            "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, match, since, "
            "checked_at) VALUES (%s, 'start_child:child_square:1:result', 'child_result:child_square', "
            "'kenning.child.finished', jsonb_build_object('child_id', CAST(%s AS text)), '-infinity', now())",
            (parent, child),
        )
    # a pending cancel request of the same source and id is not the child's end: it wakes no one
    sql.execute(
        "INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id) "
        "VALUES ('cancel', 'kenning.children', 'c', 'kenning.cancel', 'p')"
    )
    with contextlib.suppress(AssertionError):  # the invariant names exactly this case
        invariants.parents_woken(sql)
        raise RuntimeError("parents_woken did not name a parent waiting for an ended child")
    async with database.connection() as conn:
        found = await progress_sql.stuck_repair(conn, limit=10, max_repairs=3)
        expired = await retention_sql.instances_expire(conn, default_seconds=1, limit=10)
    assert [(s.instance_id, s.missing, s.cause) for s in found] == [
        ("p", "waiting_for_event for a child that ended, not woken", None)
    ]
    assert _status(sql, "p") == "pending" and _status(sql, "waiting") == "waiting_for_event"
    assert expired.instances == 0 and _status(sql, "c") == "failed"  # its parent is unfinished
    sql.execute(
        "UPDATE kenning_instances SET status = 'completed', finished_at = now() - interval '1 day' WHERE id = 'p'"
    )
    async with database.connection() as conn:
        expired = await retention_sql.instances_expire(conn, default_seconds=1, limit=10)
    assert expired.instances == 2 and _status(sql, "c") is None


async def test_children_of_a_queued_workflow_run_in_its_queue(
    shared: Shared, shared_database: Database, shared_sql: Sql
) -> None:
    """A child is started as any start is: in its workflow's queue (or the one start_child
    names), with its partition and priority, so the queue's claim and limits apply to it."""
    async with Client(database=shared_database) as client:
        parent = (await client.start("parent_of_queued", count=3)).instance_id
        assert await asyncio.wait_for(client.result(parent), timeout=30) == 0 + 1 + 2 + 100
    rows = shared_sql.execute(
        "SELECT workflow_name, status, queue_name, partition_key, priority FROM kenning_instances "
        "WHERE parent_id = %s ORDER BY workflow_name, input ->> 'n'",
        (parent,),
    ).fetchall()
    queued = ("children-queue", "", 0)
    assert rows == [
        ("child_queued", "completed", *queued),
        ("child_queued", "completed", *queued),
        ("child_queued", "completed", *queued),
        ("child_square", "completed", "children-queue", "tenant-a", 3),
    ]
    row = shared_sql.execute(
        "SELECT array_to_string(ARRAY(SELECT unnest(workflow_names) ORDER BY 1), ',') FROM kenning_queues "
        "WHERE name = 'children-queue'"
    ).fetchone()
    # each child's workflow is named, so workers that know only the child's workflow serve the queue
    assert row == ("child_queued,child_square",)


def _inbox_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's nodes that read kenning_inbox."""
    found = [plan] if plan.get("Relation Name") == "kenning_inbox" else []
    for child in plan.get("Plans", []):
        found += _inbox_scans(child)
    return found


async def test_a_child_wait_finds_its_childs_end_by_its_key_not_by_a_walk_over_every_childs_end(
    database: Database, sql: Sql
) -> None:
    """The catch-up check of a new subscription (the child ended before its parent waited,
    or while it was subscribing) probes the unique (kind, source, event_id) of the child's
    end: the inbox's other children's ends (50,000 here) are not read."""
    sql.execute(
        "INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id, data, status, processed_at) "
        "SELECT 'event', 'kenning.children', 'other-' || n, 'kenning.child.finished', 'parent-' || n, "
        "jsonb_build_object('child_id', 'other-' || n, 'status', 'completed'), 'processed', now() "
        "FROM generate_series(1, 50000) AS n"
    )
    _row(sql, "p", "fan_out_children", "waiting_for_event", run_count=1)
    sql.execute(
        "INSERT INTO kenning_inbox (kind, source, event_id, event_type, instance_id, data) VALUES ('event', "
        "'kenning.children', 'c', 'kenning.child.finished', 'p', '{\"child_id\": \"c\", \"status\": \"completed\"}')"
    )
    sql.execute(
        "INSERT INTO kenning_event_subscriptions (instance_id, step_id, step_name, event_type, match, since) "
        "VALUES ('p', 'start_child:child_square:1:result', 'child_result:child_square', 'kenning.child.finished', "
        "'{\"child_id\": \"c\"}', '-infinity')"
    )
    sql.execute("ANALYZE kenning_inbox")
    # run as it is (autocommit: its row lock ends with it), then for real below
    explained = sql.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + str(subscriptions_sql._SUBSCRIPTION_CLAIM_UNCHECKED), {"limit": 10}
    ).fetchone()
    assert explained is not None and isinstance(explained[0], list)
    scans = [scan for scan in _inbox_scans(explained[0][0]["Plan"]) if scan.get("Actual Loops", 0) > 0]
    read = sum(
        scan["Actual Rows"] * scan["Actual Loops"]
        + scan.get("Rows Removed by Filter", 0)
        + scan.get("Rows Removed by Index Recheck", 0)
        for scan in scans
    )
    assert [scan.get("Index Name") for scan in scans] == ["kenning_inbox_kind_source_event_id_key"], scans
    assert read < 10, scans
    async with database.connection() as conn:
        (unchecked,) = await subscriptions_sql.subscription_claim_unchecked(conn, limit=10)
    assert unchecked.instance_id == "p" and unchecked.event is not None and unchecked.event.event_id == "c"
