"""Forks on PostgreSQL with an in-process worker (issue 37, item 2): what a fork keeps and
what it drops, and that the steps before its step do not run again.

``forks.rich`` records, in order: 1 reserve, 2 a published value, 3 a stream entry, 4 a
received message, 5 charge, 6 a published value, 7 a stream entry, 8 ship (which fails
until ``KENNING_TEST_FORK_FIXED`` is set: the fix). Before the feature there was no
``Client.fork``, no ``forked_from`` and no statement that copies a history.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import psycopg
import pytest

from kenning import Client, WorkflowNotFoundError, codecs
from kenning.client import InvalidInputError
from kenning.client.forks import ForkStepError
from kenning.db import Database
from kenning.storage import actions as actions_sql
from kenning.storage import history as history_sql
from tests import invariants
from tests.apps import forks
from tests.logguard import expect_log
from tests.sidechannel import executions
from tests.support import eventually, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
KEY = "f1:" + base64.b64encode(b"\x05" * 32).decode()


async def _until(check: Callable[[], Awaitable[bool]], message: str) -> None:
    await eventually(cast(Any, check), message=message, timeout=15)


async def _status_is(client: Client, instance_id: str, status: str) -> None:
    async def reached() -> bool:
        return (await client.status(instance_id)).status == status

    await _until(reached, f"{instance_id} {status}")


def _count(sql: Sql, query: str, instance_id: str) -> int:
    row = sql.execute(query, (instance_id,)).fetchone()
    assert row is not None
    return int(cast(int, row[0]))


async def _failed_rich(client: Client, database: Database) -> str:
    """A ``forks.rich`` that ran all eight steps and failed at ship, compensated."""
    async with running_worker(database, forks.app):
        started = await client.start(forks.rich, order="o-1", amount=30)
        await _status_is(client, started.instance_id, "waiting_for_message")
        await client.send_message(started.instance_id, "paid", {"by": "card"})
        await _status_is(client, started.instance_id, "failed")
    return started.instance_id


async def test_a_fork_keeps_the_records_before_its_step_and_runs_from_it(
    database: Database, sql: Sql, side_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect_log("instance.failed", workflow="forks.rich")
    async with Client(database=database) as client:
        original = await _failed_rich(client, database)
        assert executions(side_channel)[f"release {original}"] == 1  # its saga was undone

        forked = await client.fork(original, "charge:1")  # by step id: step 5
        assert forked.step == 5 and forked.kept == 4
        assert forked.undone == 1  # reserve's release ran in the original: the fork is told
        fork_id = forked.fork_id

        # before any worker runs it: what was copied and what was not
        async with database.connection() as conn:
            history = await history_sql.history_shown(conn, fork_id)
        assert [h["step_id"] for h in history] == ["reserve:1", "publish_value:1", "write_stream:1", "receive:1"]
        assert not any(h["kind"].startswith("Compensation") for h in history)
        row = await client.status(fork_id)
        assert (row.status, row.forked_from, row.forked_from_step) == ("pending", original, 5)
        assert row.input == {"order": "o-1", "amount": 30}
        assert [(f.id, f.step) for f in await client.forks(original)] == [(fork_id, 5)]
        assert (await client.status(original)).status == "failed"  # the original is left as it is
        # kept: the compensation reserve registered, and the entry step 3 wrote
        comps = sql.execute(
            "SELECT comp_id FROM kenning_compensations WHERE instance_id = %s ORDER BY position", (fork_id,)
        ).fetchall()
        assert [c[0] for c in comps] == ["on_failure:reserve:1"]
        assert [e.value async for e in client.read_stream(fork_id, "log", follow=False)] == ["reserved r-o-1"]
        # dropped: published values (the kept publish is not published again), the mailbox
        assert await client.values(fork_id) == {}
        assert _count(sql, "SELECT count(*) FROM kenning_messages WHERE instance_id = %s", fork_id) == 0

        monkeypatch.setenv(forks.FIXED, "1")  # the deploy that fixes ship
        async with running_worker(database, forks.app):
            result = await client.result(fork_id, timeout=15)
        # the kept receive is not waited for again: it replays the message the original took
        assert result == {"paid": {"by": "card"}, "charged": 30, "shipped": "shipped o-1"}
        ran = executions(side_channel)
        assert ran[f"reserve {fork_id}"] == 0  # before the step: replayed, not run
        assert ran[f"charge {fork_id} 30"] == 1 and ran[f"ship {fork_id}"] == 1
        assert ran[f"reserve {original}"] == 1 and ran[f"ship {original}"] == 1  # the original's, once
        assert await client.values(fork_id) == {"stage": "charged"}
        entries = [e.value async for e in client.read_stream(fork_id, "log", follow=False)]
        assert entries == ["reserved r-o-1", "charged 30"]

        # the action log: one fork, aimed at the original, naming the fork
        async with database.connection() as conn:
            logged = await actions_sql.actions_list(conn, target=original, action="fork")
        assert len(logged) == 1 and logged[0].origin == "api"
        assert logged[0].details["fork_id"] == fork_id and logged[0].details["step"] == 5


async def test_a_fork_that_fails_again_runs_the_compensations_its_kept_steps_registered(
    database: Database, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="forks.rich")
    async with Client(database=database) as client:
        original = await _failed_rich(client, database)
        fork = await client.fork(original, 5, input={"order": "o-1", "amount": 7})  # not fixed
        async with running_worker(database, forks.app):
            await _status_is(client, fork.fork_id, "failed")
        ran = executions(side_channel)
        # charge ran anew with the replaced input; reserve did not, but its release is the fork's too
        assert ran[f"charge {fork.fork_id} 7"] == 1 and ran[f"reserve {fork.fork_id}"] == 0
        assert ran[f"refund {fork.fork_id}"] == 1 and ran[f"release {fork.fork_id}"] == 1


async def test_a_fork_of_a_waiting_instance_waits_on_its_own(database: Database, sql: Sql, side_channel: str) -> None:
    async with Client(database=database) as client:
        async with running_worker(database, forks.app):
            started = await client.start(forks.rich, order="o-2", amount=5)
            original = started.instance_id
            await _status_is(client, original, "waiting_for_message")
            await client.send_message(original, "other", "not for the fork")  # another topic's mailbox
            fork = await client.fork(original, 3)  # keeps reserve and the publish; writes the entry anew
            assert fork.kept == 2
            await _status_is(client, fork.fork_id, "waiting_for_message")
        waits = sql.execute(
            "SELECT instance_id, step_id FROM kenning_message_waits WHERE instance_id = ANY(%s) ORDER BY instance_id",
            ([original, fork.fork_id],),
        ).fetchall()
        # the original's wait is not moved, copied or woken: each waits with a wait of its own
        assert sorted(str(w[0]) for w in waits) == sorted([original, fork.fork_id])
        assert _count(sql, "SELECT count(*) FROM kenning_messages WHERE instance_id = %s", fork.fork_id) == 0
        assert [e.value async for e in client.read_stream(fork.fork_id, "log", follow=False)] == ["reserved r-o-2"]
        assert executions(side_channel)[f"reserve {fork.fork_id}"] == 0
        assert (await client.status(original)).status == "waiting_for_message"


async def test_a_step_it_does_not_have_or_an_input_its_workflow_refuses_makes_no_fork(
    database: Database, sql: Sql
) -> None:
    expect_log("instance.failed", workflow="forks.rich")
    async with Client(database=database) as client:
        original = await _failed_rich(client, database)
        with pytest.raises(ForkStepError, match=r"step 99 is out of range: its history's steps are 1 to \d+"):
            await client.fork(original, 99)
        with pytest.raises(ForkStepError, match="out of range"):
            await client.fork(original, 0)
        with pytest.raises(ForkStepError, match="no step 'refund:9'"):
            await client.fork(original, "refund:9")
        with pytest.raises(ForkStepError, match="is a compensation's record"):
            await client.fork(original, 9)
        with pytest.raises(InvalidInputError, match=r"invalid input for workflow 'forks\.rich'"):
            await client.fork(original, 5, input={"order": "o-1", "amount": "thirty"})
        with pytest.raises(WorkflowNotFoundError):
            await client.fork("no-such-instance", 1)
        assert _count(sql, "SELECT count(*) FROM kenning_instances WHERE forked_from = %s", original) == 0
        assert _count(sql, "SELECT count(*) FROM kenning_operator_actions WHERE target = %s", original) == 0


@pytest.fixture
def sealed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Payload encryption on in this process (the client and the in-process worker)."""
    monkeypatch.delenv(codecs.KEYS_VARIABLE, raising=False)
    codecs.configure(keys=KEY)
    yield
    codecs.reset()


async def _listener_forked(client: Client, database: Database, side_channel: str, sql: Sql, channel: str) -> None:
    async with running_worker(database, forks.app):
        original = (await client.start(forks.listener, channel=channel)).instance_id
        await _status_is(client, original, "waiting_for_message")
        fork = await client.fork(original, 2)  # keeps the subscribe, runs note again
        subscribed = sql.execute(
            "SELECT instance_id FROM kenning_channel_subscriptions WHERE channel = %s", (channel,)
        ).fetchall()
        assert sorted(str(s[0]) for s in subscribed) == sorted([original, fork.fork_id])
        await _status_is(client, fork.fork_id, "waiting_for_message")
        assert await client.publish(channel, {"headline": "forked"}) == 2  # both are subscribed
        assert await client.result(fork.fork_id, timeout=15) == {"headline": "forked"}
        assert await client.result(original, timeout=15) == {"headline": "forked"}
    ran = executions(side_channel)
    assert ran[f"note {fork.fork_id}"] == 1 and ran[f"note {original}"] == 1


async def test_a_fork_keeps_the_channel_subscriptions_of_its_kept_steps(
    database: Database, sql: Sql, side_channel: str
) -> None:
    async with Client(database=database) as client:
        await _listener_forked(client, database, side_channel, sql, "news")


async def test_a_fork_keeps_the_channel_subscriptions_of_its_kept_steps_under_encryption(
    database: Database, sql: Sql, side_channel: str, sealed: None
) -> None:
    """A channel name is not a user payload: it stays plain with a key set, so the copy
    finds it, and the fork is subscribed as it is without encryption."""
    async with Client(database=database) as client:
        await _listener_forked(client, database, side_channel, sql, "sealed-news")
    # encryption was on (an activity's result is an envelope) and the subscribe record
    # names its channel in the clear, as docs/operations.md lists: what the copy reads
    records = sql.execute("SELECT step_id, payload FROM kenning_history ORDER BY seq").fetchall()
    payloads = {str(step_id): payload for step_id, payload in records}
    assert codecs.is_sealed(cast(dict[str, Any], payloads["note:1"])["result"])
    assert payloads["subscribe:1"] == {"channel": "sealed-news"}


async def test_a_fork_keeps_the_children_its_kept_steps_started_without_starting_them_again(
    database: Database, sql: Sql, side_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect_log("instance.failed", workflow="forks.parent")
    async with Client(database=database) as client:
        async with running_worker(database, forks.app):
            original = (await client.start(forks.parent, n=4)).instance_id
            await _status_is(client, original, "failed")
        (child_id,) = [
            str(r[0]) for r in sql.execute("SELECT id FROM kenning_instances WHERE parent_id = %s", (original,))
        ]
        monkeypatch.setenv(forks.FIXED, "1")
        # from step 2, the child's result: the ChildStarted record is kept, the child has
        # ended, so the fork takes its result at once; from step 3, the result record too
        from_result = await client.fork(original, 2)
        from_ship = await client.fork(original, 3)
        async with running_worker(database, forks.app):
            assert await client.result(from_result.fork_id, timeout=15) == "40 shipped 4"
            assert await client.result(from_ship.fork_id, timeout=15) == "40 shipped 4"
        # no child started again: the one child is still the original's
        children = sql.execute(
            "SELECT id, parent_id FROM kenning_instances WHERE workflow_name = 'forks.child'"
        ).fetchall()
        assert [(str(c), str(p)) for c, p in children] == [(child_id, original)]
        assert executions(side_channel)[f"note {child_id}"] == 1
        invariants.children_once_per_step(sql)  # a fork's kept start names its original's child


def _children(sql: Sql, parent: str) -> list[str]:
    return [str(r[0]) for r in sql.execute("SELECT id FROM kenning_instances WHERE parent_id = %s", (parent,))]


async def test_a_fork_that_would_keep_a_running_child_is_refused_with_the_step_to_fork_from(
    database: Database, sql: Sql, side_channel: str
) -> None:
    """Before the fix the fork was made and waited for ever: the child, the original's,
    tells only the original of its end."""
    async with Client(database=database) as client, running_worker(database, forks.app):
        original = (await client.start(forks.waiting_parent, n=2)).instance_id
        await _status_is(client, original, "waiting_for_event")
        (child_id,) = _children(sql, original)
        await _status_is(client, child_id, "waiting_for_message")

        # from step 2 (or its id) the fork would keep step 1's start_child: refused, naming
        # the child and the step to fork from instead; nothing is made or logged
        expected = rf"step 1 \(start_child:forks.awaited:1\) started child {child_id}, which is still running"
        for step in (2, "note:1"):
            with pytest.raises(ForkStepError, match=expected + ".*fork from step 1 or earlier"):
                await client.fork(original, step)
        assert _count(sql, "SELECT count(*) FROM kenning_instances WHERE forked_from = %s", original) == 0
        assert _count(sql, "SELECT count(*) FROM kenning_operator_actions WHERE target = %s", original) == 0

        # from step 1 the fork starts a child of its own, which tells the fork of its end
        own = await client.fork(original, 1)
        await _status_is(client, own.fork_id, "waiting_for_event")
        (own_child,) = _children(sql, own.fork_id)
        for child in (child_id, own_child):
            await client.send_message(child, "go", None)
        assert await client.result(original, timeout=15) == 20
        assert await client.result(own.fork_id, timeout=15) == 20

        # once the child has ended, a fork keeping its start takes its result at once
        later = await client.fork(original, 2)
        assert await client.result(later.fork_id, timeout=15) == 20
    assert _children(sql, later.fork_id) == []
    assert executions(side_channel)[f"note {later.fork_id}"] == 1
    invariants.children_once_per_step(sql)
