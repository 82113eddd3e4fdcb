"""Version pinning's claim filter (docs/operations.md#version-pinning), against real
PostgreSQL: a pinned workflow's instance is pinned by its first claim to the claimer's
code version, and from then on only a claimer of that version takes it, in the plain
claim and a queue's alike; an unpinned one goes to any claimer."""

from __future__ import annotations

import psycopg

from kenning.core.records import NewInstance
from kenning.db import Database
from kenning.storage import children as children_sql
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import progress as progress_sql
from kenning.storage import queues as queues_sql
from kenning.testing import WorkflowEnvironment

Sql = psycopg.Connection[tuple[object, ...]]


async def _start(database: Database, *starts: tuple[str, str], queue: str | None = None) -> None:
    async with database.connection() as conn:
        await instances_sql.instances_start(
            conn,
            [NewInstance(i, wf, "h", {}, queue_name=queue, partition_key="" if queue else None) for i, wf in starts],
        )


def _pins(sql: Sql) -> dict[str, object]:
    return {str(r[0]): r[1] for r in sql.execute("SELECT id, pinned_version FROM kenning_instances ORDER BY id")}


def _hand_back(sql: Sql) -> None:
    """Every lease given back, each instance due again (a suspension, a retry's back-off)."""
    sql.execute("UPDATE kenning_instances SET lease_token = NULL, lease_owner = NULL, available_at = now()")


async def test_the_first_claim_pins_and_only_that_version_claims_again(database: Database, sql: Sql) -> None:
    await _start(database, ("p1", "pinned_wf"), ("p2", "pinned_wf"), ("a1", "auto_wf"))
    names = ["pinned_wf", "auto_wf"]
    async with database.connection() as conn:
        first = await claims_sql.instance_claim(
            conn, owner="w1", workflow_names=names, limit=10, lease_seconds=30, code_version="v1", pinned=["pinned_wf"]
        )
    assert sorted(c.id for c in first.instances) == ["a1", "p1", "p2"]
    # pinned to the claimer's version; the auto_upgrade one stays free for any worker
    assert _pins(sql) == {"a1": None, "p1": "v1", "p2": "v1"}

    _hand_back(sql)
    async with database.connection() as conn:
        # a worker of the next version (whose pinned_wf is pinned too) takes only a1
        newer = await claims_sql.instance_claim(
            conn, owner="w2", workflow_names=names, limit=10, lease_seconds=30, code_version="v2", pinned=["pinned_wf"]
        )
        assert [c.id for c in newer.instances] == ["a1"]
        # and the pinned ones are not "due next" to it: it sleeps until its own work comes
        assert newer.seconds_until_next is None
        # a claimer with no version (a tool, the bench's bare claim) takes no pinned instance
        bare = await claims_sql.instance_claim(conn, owner="w0", workflow_names=names, limit=10, lease_seconds=30)
        assert bare.instances == []
        # the version they started on takes them, and keeps them pinned to it
        again = await claims_sql.instance_claim(
            conn, owner="w3", workflow_names=names, limit=10, lease_seconds=30, code_version="v1"
        )
    assert sorted(c.id for c in again.instances) == ["p1", "p2"]
    assert _pins(sql) == {"a1": None, "p1": "v1", "p2": "v1"}


async def test_an_expired_lease_of_a_pinned_instance_is_taken_over_only_by_its_version(
    database: Database, sql: Sql
) -> None:
    await _start(database, ("p", "pinned_wf"))
    claim = dict(workflow_names=["pinned_wf"], limit=5, lease_seconds=30, pinned=["pinned_wf"])
    async with database.connection() as conn:
        (held,) = (await claims_sql.instance_claim(conn, owner="w1", code_version="v1", **claim)).instances  # type: ignore[arg-type]
    # its worker died: the lease expired, the row is due for a takeover
    sql.execute("UPDATE kenning_instances SET available_at = now() - interval '1 second'")
    async with database.connection() as conn:
        other = await claims_sql.instance_claim(conn, owner="w2", code_version="v2", **claim)  # type: ignore[arg-type]
        assert other.instances == []
        (taken,) = (await claims_sql.instance_claim(conn, owner="w3", code_version="v1", **claim)).instances  # type: ignore[arg-type]
    assert taken.id == held.id and taken.taken_over


async def test_a_queue_claim_keeps_pinned_instances_to_their_version(database: Database, sql: Sql) -> None:
    async with database.connection() as conn:
        await queues_sql.queues_declare(conn, [queues_sql.QueueLimits("versions", concurrency=10)])
    await _start(database, ("q1", "pinned_wf"), ("q2", "auto_wf"), queue="versions")
    claim = dict(queue="versions", workflow_names=["pinned_wf", "auto_wf"], limit=5, lease_seconds=30)
    async with database.connection() as conn:
        first = await claims_sql.queue_claim(conn, owner="w1", code_version="v1", pinned=["pinned_wf"], **claim)  # type: ignore[arg-type]
    assert sorted(c.id for c in first.instances) == ["q1", "q2"]
    assert _pins(sql) == {"q1": "v1", "q2": None}
    _hand_back(sql)
    async with database.connection() as conn:
        newer = await claims_sql.queue_claim(conn, owner="w2", code_version="v2", pinned=["pinned_wf"], **claim)  # type: ignore[arg-type]
        assert [c.id for c in newer.instances] == ["q2"]
        again = await claims_sql.queue_claim(conn, owner="w3", code_version="v1", **claim)  # type: ignore[arg-type]
    assert [c.id for c in again.instances] == ["q1"]


async def test_a_queued_pinned_instance_asked_to_cancel_compensates_on_its_version(
    database: Database, sql: Sql
) -> None:
    # the plain claim takes a queued instance asked to cancel, outside its queue's limits:
    # its compensations replay its history, so only its version may take it
    await _start(database, ("q", "pinned_wf"), queue="full")
    sql.execute("UPDATE kenning_instances SET pinned_version = 'v1', cancel_requested = true")
    claim = dict(workflow_names=["pinned_wf"], limit=5, lease_seconds=30, pinned=["pinned_wf"])
    async with database.connection() as conn:
        other = await claims_sql.instance_claim(conn, owner="w2", code_version="v2", **claim)  # type: ignore[arg-type]
        assert other.instances == [] and other.seconds_until_next is None
        (own,) = (await claims_sql.instance_claim(conn, owner="w1", code_version="v1", **claim)).instances  # type: ignore[arg-type]
    assert own.id == "q" and own.cancel_requested


async def test_pinned_instances_whose_version_has_no_live_worker_are_found(database: Database, sql: Sql) -> None:
    await _start(database, ("p1", "pinned_wf"), ("p2", "pinned_wf"), ("p3", "pinned_wf"))
    sql.execute("UPDATE kenning_instances SET pinned_version = CASE WHEN id = 'p3' THEN 'v2' ELSE 'v1' END")
    sql.execute(
        "INSERT INTO kenning_processes (id, kind, host, pid, version, started_at, last_seen, expires_after_seconds,"
        " details) VALUES ('w-v2', 'worker', 'h', 1, 'k', now(), now(), 60,"
        ' \'{"workflows": ["pinned_wf"], "code_version": "v2"}\'),'
        " ('w-v1-gone', 'worker', 'h', 2, 'k', now(), now() - interval '1 hour', 60,"
        ' \'{"workflows": ["pinned_wf"], "code_version": "v1"}\')'
    )
    async with database.connection() as conn:
        found = await progress_sql.instances_pinned_orphaned(conn, seconds=0, limit=10)
    # v1's only worker is stale: its two instances wait; v2's run
    assert [(f.workflow_name, f.version, f.count, f.oldest_id, f.live_versions) for f in found] == [
        ("pinned_wf", "v1", 2, "p1", ["v2"])
    ]


async def test_a_pinned_child_of_a_pinned_parent_starts_on_the_parents_version(database: Database, sql: Sql) -> None:
    # the parents: one pinned by its claim (a v1 worker's), one of an auto_upgrade workflow
    await _start(database, ("pinned-parent", "pinned_wf"), ("auto-parent", "auto_wf"))
    async with database.connection() as conn:
        claim = await claims_sql.instance_claim(
            conn,
            owner="w1",
            workflow_names=["pinned_wf", "auto_wf"],
            limit=2,
            lease_seconds=60,
            code_version="v1",
            pinned=["pinned_wf"],
        )
        tokens = {c.id: c.lease_token for c in claim.instances}
        for parent, child, pinned in (
            ("pinned-parent", "pinned-child", True),  # pinned as its parent: v1
            ("pinned-parent", "auto-child", False),  # an auto_upgrade child is pinned to nothing
            ("auto-parent", "orphan-child", True),  # no version to inherit: its first claim pins it
        ):
            started = await children_sql.child_start_and_record(
                conn,
                parent_id=parent,
                token=tokens[parent],
                step_id=f"start_child:{child}",
                step_name="start_child",
                child=NewInstance(child, "child_wf", "h", {}),
                on_parent_cancel="cancel",
                pinned=pinned,
            )
            assert started is not None and started.recorded
    pins = _pins(sql)
    assert (pins["pinned-child"], pins["auto-child"], pins["orphan-child"]) == ("v1", None, None)
    # a worker of another version does not take the child pinned to v1
    async with database.connection() as conn:
        other = await claims_sql.instance_claim(
            conn, owner="w2", workflow_names=["child_wf"], limit=5, lease_seconds=30, code_version="v2"
        )
    assert sorted(c.id for c in other.instances) == ["auto-child", "orphan-child"]


async def test_kenning_testing_runs_pinned_workflows_on_both_backends(database_url: str, sql: Sql) -> None:
    # one process is one code version: in memory the option changes nothing; on PostgreSQL
    # the real worker pins each instance to its own version, its child to the parent's
    from tests.apps import pinning_v1

    async with WorkflowEnvironment(pinning_v1.app) as env:
        assert await (await env.start(pinning_v1.pinned_parent)).result() == "v1 parent of v1 child"
    async with WorkflowEnvironment(pinning_v1.app, database_url=database_url, migrate=False) as env:
        handle = await env.start(pinning_v1.pinned_parent)
        assert await handle.result() == "v1 parent of v1 child"
    pins = [p for (p,) in sql.execute("SELECT pinned_version FROM kenning_instances").fetchall()]
    assert len(pins) == 2 and pins[0] is not None and pins[0] == pins[1]  # the parent and its child
