"""The port's contract member by member (issue 38, item 7), as River's ``riverdrivertest``
``Exercise`` runs one subtest per driver method against every driver: each member of
``kenning.engine.port.InstancePort`` is exercised on the in-memory port
(``kenning.testing.memoryport``) and on the worker's PostgreSQL port (``kenning_worker.port``,
a real database), and must do what the protocol says of it: its answer, what it writes,
its refusal when the lease moved or a cancel was committed.

``test_port_contract.py`` beside it runs whole workflows on both and compares the ends;
this one names the member that drifted. ``test_every_port_member_has_its_contract``
holds the suite to the protocol: a member added to the port fails it until it has a
test here (``@contract("member")``).

Where the two ports answer one refusal in two shapes (a lost lease raised, or answered
as ``SuspendOutcome.LEASE_LOST``), the test accepts either and asserts that nothing was
written; where they disagree on what is written, the side that departs from the
member's docstring is fixed (a deferred record held back and dropped by ``discard`` on
both, ``flush`` writing unsaved compensations only with a held-back record on both (the
protocol's docstring said otherwise; PostgreSQL's folding is the design), ``continue_as_new`` keeping
the lease on both), never the test loosened.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest

from kenning.context import StepScope
from kenning.core.mailbox import Undelivered
from kenning.core.names import (
    ACTIVITY_COMPLETED,
    CHANNEL_SUBSCRIBED,
    CHILD_STARTED,
    EVENT_RECEIVED,
    MESSAGE_RECEIVED,
    MESSAGE_REPLIED,
    MESSAGE_SENT,
    STREAM_CLOSED,
    STREAM_WRITTEN,
    VALUE_PUBLISHED,
)
from kenning.core.records import CompensationRecord, HistoryRecord, OutboxEvent, SuspendOutcome
from kenning.db import Database, connect
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.engine import port as port_module
from kenning.engine.commands import (
    BeginCompensating,
    CloseStream,
    Complete,
    ContinueAsNew,
    CountAttempt,
    FailSaga,
    FinalStatus,
    Finish,
    Publish,
    PublishValue,
    ReceiveMessage,
    RecordHeartbeat,
    RecordStep,
    ReleaseWithDelay,
    ReplyMessage,
    SaveCompensation,
    SendMessage,
    StartChild,
    Subscribe,
    SuspendOnEvent,
    SuspendOnTimer,
    WaitChild,
    WriteStream,
)
from kenning.engine.history import StepRecord
from kenning.engine.port import InstancePort
from kenning.errors import CancelSeenBeforeWrite, LeaseLostError, StreamClosedError
from kenning.storage import claims as claims_sql
from kenning.storage import instances as instances_sql
from kenning.storage import writes as writes_sql
from kenning.storage.writes import InstanceWrite
from kenning.testing.memoryport import MemoryPort
from kenning.testing.memorystate import MemoryInstance
from kenning_worker.port import PgInstancePort

T = TypeVar("T")
SIDES = ("memory", "postgresql")
COVERED: dict[str, list[str]] = {}  # port member -> the tests of it


def contract(member: str) -> Callable[[T], T]:
    """Marks a test as (part of) the contract of ``member``."""

    def mark(test: T) -> T:
        COVERED.setdefault(member, []).append(getattr(test, "__name__", repr(test)))
        return test

    return mark


def record(step_id: str, kind: str = ACTIVITY_COMPLETED, payload: Any = None) -> StepRecord:
    return StepRecord(step_id, kind, step_id.split(":")[0], {"result": step_id} if payload is None else payload)


def compensation(comp_id: str) -> CompensationRecord:
    return CompensationRecord(comp_id, 1, "tests.undo", ["a"], {})


# ---------------------------------------------------------------- the two sides


class Side:
    """One port implementation and a view of what it stored, as the tests read it."""

    name: str

    async def add(self, instance_id: str) -> None:
        """A new instance (workflow ``wf-<id>``, input ``{"n": 1}``), not claimed."""
        raise NotImplementedError

    async def start(self, instance_id: str) -> InstancePort:
        """A new instance, claimed by a new port."""
        await self.add(instance_id)
        return await self.claim(instance_id)

    async def claim(self, instance_id: str) -> InstancePort:
        raise NotImplementedError

    async def steal(self, instance_id: str) -> None:
        """Another holder takes the lease (the port's token is stale)."""
        raise NotImplementedError

    async def cancel(self, instance_id: str) -> None:
        """A cancel request committed."""
        raise NotImplementedError

    async def set_deadline(self, instance_id: str, seconds_from_now: float) -> None:
        raise NotImplementedError

    async def row(self, instance_id: str) -> dict[str, Any]:
        """status, result, error, input, run, leased (a lease token is set), attempts."""
        raise NotImplementedError

    async def history(self, instance_id: str) -> list[tuple[str, str]]:
        """(step id, kind) of each record, in order."""
        raise NotImplementedError

    async def compensations(self, instance_id: str) -> list[str]:
        raise NotImplementedError

    async def outbox(self, instance_id: str) -> list[str]:
        raise NotImplementedError

    async def mailbox(self, instance_id: str) -> list[tuple[str, str, Any]]:
        """(topic, message id, data) of each unconsumed message, in sending order."""
        raise NotImplementedError

    async def reply(self, instance_id: str, message_id: str) -> tuple[Any, str | None] | None:
        raise NotImplementedError

    async def value(self, instance_id: str, key: str) -> Any:
        raise NotImplementedError

    async def stream(self, instance_id: str, key: str) -> list[Any]:
        raise NotImplementedError

    async def exists(self, instance_id: str) -> bool:
        raise NotImplementedError


class MemorySide(Side):
    name = "memory"

    def __init__(self) -> None:
        self.instances: dict[str, MemoryInstance] = {}  # every instance's peers: send and publish reach them

    def _find(self, instance_id: str) -> MemoryInstance:
        if instance_id not in self.instances:
            for instance in list(self.instances.values()):
                for child in instance.children:
                    child.peers = self.instances
                    self.instances[child.id] = child
        return self.instances[instance_id]

    async def add(self, instance_id: str) -> None:
        self.instances[instance_id] = MemoryInstance(instance_id, f"wf-{instance_id}", {"n": 1}, peers=self.instances)

    async def claim(self, instance_id: str) -> InstancePort:
        instance = self._find(instance_id)
        return MemoryPort(instance, instance.claim().lease_token)

    async def steal(self, instance_id: str) -> None:
        self._find(instance_id).lease_token = str(uuid.uuid4())

    async def cancel(self, instance_id: str) -> None:
        self._find(instance_id).cancel_requested = True

    async def set_deadline(self, instance_id: str, seconds_from_now: float) -> None:
        self._find(instance_id).deadline_at = datetime.now(UTC).timestamp() + seconds_from_now

    async def row(self, instance_id: str) -> dict[str, Any]:
        i = self._find(instance_id)
        return {
            "status": i.status,
            "result": i.result,
            "error": i.error,
            "input": i.input,
            "run": i.run,
            "leased": i.lease_token is not None,
            "attempts": i.attempts,
        }

    async def history(self, instance_id: str) -> list[tuple[str, str]]:
        return [(r.step_id, r.kind) for r in self._find(instance_id).history]

    async def compensations(self, instance_id: str) -> list[str]:
        return [c.comp_id for c in self._find(instance_id).compensations]

    async def outbox(self, instance_id: str) -> list[str]:
        return [e.event_id for e in self._find(instance_id).outbox]

    async def mailbox(self, instance_id: str) -> list[tuple[str, str, Any]]:
        return [(m.topic, m.message_id, m.data) for m in self._find(instance_id).mailbox if m.consumed_step_id is None]

    async def reply(self, instance_id: str, message_id: str) -> tuple[Any, str | None] | None:
        return self._find(instance_id).replies.get(message_id)

    async def value(self, instance_id: str, key: str) -> Any:
        return self._find(instance_id).values.get(key)

    async def stream(self, instance_id: str, key: str) -> list[Any]:
        stream = self._find(instance_id).streams.get(key)
        return [] if stream is None else [e.value for e in stream.entries]

    async def exists(self, instance_id: str) -> bool:
        try:
            self._find(instance_id)
        except KeyError:
            return False
        return True


class PostgresSide(Side):
    name = "postgresql"

    def __init__(self, database: Database, sql: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.database = database
        self.sql = sql

        async def apply(writes: Sequence[InstanceWrite]) -> list[bool | None]:
            async with database.connection() as conn:
                return await writes_sql.writes_apply(conn, writes)

        self.writes: GroupCommit[InstanceWrite, bool | None] = GroupCommit(
            write=apply, retry_alone=may_be_one_callers_fault
        )

    def _one(self, query: str, *params: Any) -> Any:
        row = self.sql.execute(query, params).fetchone()
        return None if row is None else row[0]

    def _all(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.sql.execute(query, params).fetchall()

    async def add(self, instance_id: str) -> None:
        async with self.database.connection() as conn:
            await instances_sql.instance_insert(
                conn,
                instance_id=instance_id,
                workflow_name=f"wf-{instance_id}",
                source_hash="h",
                input_json={"n": 1},
                idempotency_key=None,
            )

    async def claim(self, instance_id: str) -> InstancePort:
        workflow = self._one("SELECT workflow_name FROM kenning_instances WHERE id = %s", instance_id)
        async with self.database.connection() as conn:
            (claimed,) = (
                await claims_sql.instance_claim(
                    conn, owner="contract", workflow_names=[workflow], limit=1, lease_seconds=300
                )
            ).instances
        assert claimed.id == instance_id
        return PgInstancePort(database=self.database, claimed=claimed, writes=self.writes)

    async def steal(self, instance_id: str) -> None:
        self.sql.execute("UPDATE kenning_instances SET lease_token = gen_random_uuid() WHERE id = %s", (instance_id,))

    async def cancel(self, instance_id: str) -> None:
        self.sql.execute("UPDATE kenning_instances SET cancel_requested = true WHERE id = %s", (instance_id,))

    async def set_deadline(self, instance_id: str, seconds_from_now: float) -> None:
        self.sql.execute(
            "UPDATE kenning_instances SET deadline_at = now() + make_interval(secs => %s) WHERE id = %s",
            (seconds_from_now, instance_id),
        )

    async def row(self, instance_id: str) -> dict[str, Any]:
        status, result, error, input_, run, leased, attempts = self._all(
            "SELECT status, result, error, input, run, lease_token IS NOT NULL, attempts"
            " FROM kenning_instances WHERE id = %s",
            instance_id,
        )[0]
        return {
            "status": status,
            "result": result,
            "error": error,
            "input": input_,
            "run": run,
            "leased": leased,
            "attempts": attempts or {},
        }

    async def history(self, instance_id: str) -> list[tuple[str, str]]:
        rows = self._all("SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", instance_id)
        return [(step_id, kind) for step_id, kind in rows]

    async def compensations(self, instance_id: str) -> list[str]:
        rows = self._all(
            "SELECT comp_id FROM kenning_compensations WHERE instance_id = %s ORDER BY position, comp_id", instance_id
        )
        return [r[0] for r in rows]

    async def outbox(self, instance_id: str) -> list[str]:
        return [
            r[0]
            for r in self._all(
                "SELECT CAST(id AS text) FROM kenning_outbox WHERE instance_id = %s ORDER BY id", instance_id
            )
        ]

    async def mailbox(self, instance_id: str) -> list[tuple[str, str, Any]]:
        rows = self._all(
            "SELECT topic, message_id, data FROM kenning_messages"
            " WHERE instance_id = %s AND consumed_step_id IS NULL ORDER BY seq",
            instance_id,
        )
        return [(topic, message_id, data) for topic, message_id, data in rows]

    async def reply(self, instance_id: str, message_id: str) -> tuple[Any, str | None] | None:
        rows = self._all(
            "SELECT value, error FROM kenning_replies WHERE instance_id = %s AND message_id = %s",
            instance_id,
            message_id,
        )
        return None if not rows else (rows[0][0], rows[0][1])

    async def value(self, instance_id: str, key: str) -> Any:
        return self._one("SELECT value FROM kenning_values WHERE instance_id = %s AND key = %s", instance_id, key)

    async def stream(self, instance_id: str, key: str) -> list[Any]:
        rows = self._all(
            'SELECT value FROM kenning_stream_entries WHERE instance_id = %s AND key = %s ORDER BY "offset"',
            instance_id,
            key,
        )
        return [r[0] for r in rows]

    async def exists(self, instance_id: str) -> bool:
        return bool(self._one("SELECT count(*) FROM kenning_instances WHERE id = %s", instance_id))


@pytest.fixture(params=SIDES)
async def side(request: pytest.FixtureRequest) -> AsyncIterator[Side]:
    if request.param == "memory":
        yield MemorySide()
        return
    # the database's own fixture is asynchronous: opened here, on the memory side never
    database = connect(request.getfixturevalue("database_url"))
    try:
        yield PostgresSide(database, request.getfixturevalue("sql"))
    finally:
        await database.dispose()


async def refused_for_its_lease(write: Awaitable[Any]) -> None:
    """The write was refused because the lease moved: raised, or answered as ``LEASE_LOST``."""
    try:
        answer = await write
    except LeaseLostError:
        return
    assert answer is SuspendOutcome.LEASE_LOST, answer


# ---------------------------------------------------------------- the contract


def test_every_port_member_has_its_contract() -> None:
    members = {n for n in vars(InstancePort) if not n.startswith("_")}
    assert members, "no member read from the protocol"
    assert sorted(members - COVERED.keys()) == [], "port members without a contract test here"
    assert sorted(COVERED.keys() - members) == [], "contract tests naming no port member"
    for implementation in (MemoryPort, PgInstancePort):
        assert sorted(m for m in members if not hasattr(implementation, m)) == [], implementation


def test_the_protocol_read_here_is_the_engines() -> None:
    assert port_module.InstancePort is InstancePort
    assert {"cancel_requested", "record_step", "continue_as_new"} <= set(vars(InstancePort))


async def test_a_planted_defect_in_one_member_fails_that_members_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply stored twice (the first one overwritten) on the in-memory port: the
    member's own test names it."""
    await test_reply_message_keeps_the_first_reply(MemorySide())

    async def overwrites(self: MemoryPort, command: ReplyMessage) -> bool:
        self.instance.replies[command.message_id] = (command.value, command.error)
        await self.record_step(RecordStep(command.record))
        return True

    monkeypatch.setattr(MemoryPort, "reply_message", overwrites)
    with pytest.raises(AssertionError):
        await test_reply_message_keeps_the_first_reply(MemorySide())


@contract("cancel_requested")
async def test_cancel_requested_is_seen_by_the_next_fenced_write(side: Side) -> None:
    port = await side.start("i")
    assert port.cancel_requested is False
    await side.cancel("i")
    counted = await port.count_attempt(CountAttempt("a:1", 1, "boom"))
    assert counted.cancel_requested is True and port.cancel_requested is True


def opened(step: StepScope) -> bool:
    return step.in_transaction


@contract("open_step")
async def test_open_step_commits_its_outbox_event_with_the_steps_record(side: Side) -> None:
    port = await side.start("i")
    step = port.open_step()
    assert not opened(step)  # lazily
    event_id = str(uuid.uuid4())
    event = OutboxEvent(event_id, "i", "contract.sent", "/contract", None, "application/json", '{"n": 1}', None, {})
    await step.add_outbox_event(event)
    assert opened(step)
    assert await side.outbox("i") == []  # not before the record
    await port.record_step(RecordStep(record("a:1")), step)
    assert await side.outbox("i") == [event_id]
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("record_step")
async def test_record_step_writes_at_once_when_not_deferred(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=False))
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("record_step")
async def test_record_step_is_refused_with_nothing_written_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.record_step(RecordStep(record("a:1"), defer=False))
    assert await side.history("i") == []


@contract("save_compensation")
async def test_save_compensation_is_written_with_the_next_write(side: Side) -> None:
    port = await side.start("i")
    port.save_compensation(SaveCompensation(compensation("undo-1")))
    assert await side.compensations("i") == []
    await port.record_step(RecordStep(record("a:1"), defer=False))
    assert await side.compensations("i") == ["undo-1"]


@contract("flush")
async def test_flush_writes_the_deferred_record(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    await port.flush()
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]
    await port.flush()  # nothing held back: nothing more
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("flush")
async def test_flush_writes_compensations_only_with_a_held_back_record(side: Side) -> None:
    port = await side.start("i")
    port.save_compensation(SaveCompensation(compensation("undo-1")))
    await port.flush()
    assert await side.compensations("i") == []  # no record held back: they wait for the next write
    await port.record_step(RecordStep(record("a:1"), defer=True))
    await port.flush()
    assert await side.compensations("i") == ["undo-1"]
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("discard")
async def test_discard_drops_the_held_back_record(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    port.discard()
    await port.flush()
    assert await side.history("i") == []


@contract("count_attempt")
async def test_count_attempt_keeps_the_count_and_the_first_failure(side: Side) -> None:
    port = await side.start("i")
    first = await port.count_attempt(CountAttempt("a:1", 1, "boom"))
    second = await port.count_attempt(CountAttempt("a:1", 2, "boom again"))
    assert first.cancel_requested is False and first.seconds_since_first_failure >= 0
    assert second.seconds_since_first_failure >= first.seconds_since_first_failure
    attempts = (await side.row("i"))["attempts"]["a:1"]
    assert (attempts["attempts"], attempts["last_error"]) == (2, "boom again")


@contract("count_attempt")
async def test_count_attempt_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.count_attempt(CountAttempt("a:1", 1, "boom"))
    assert (await side.row("i"))["attempts"] == {}


@contract("record_heartbeat")
async def test_record_heartbeat_keeps_the_details_and_answers_false_without_the_lease(side: Side) -> None:
    port = await side.start("i")
    assert await port.record_heartbeat(RecordHeartbeat("a:1", {"row": 3})) is True
    assert (await side.row("i"))["attempts"]["a:1"]["heartbeat_details"] == {"row": 3}
    await side.steal("i")
    assert await port.record_heartbeat(RecordHeartbeat("a:1", {"row": 4})) is False  # not raised
    assert (await side.row("i"))["attempts"]["a:1"]["heartbeat_details"] == {"row": 3}


@contract("deadline_passed")
async def test_deadline_passed_answers_only_a_passed_deadline(side: Side) -> None:
    port = await side.start("i")
    assert await port.deadline_passed() is None  # none set
    await side.set_deadline("i", 3600)
    assert await port.deadline_passed() is None  # not yet
    await side.set_deadline("i", -60)
    passed = await port.deadline_passed()
    assert isinstance(passed, datetime) and passed <= datetime.now(UTC)


@contract("release")
async def test_release_gives_the_lease_back(side: Side) -> None:
    port = await side.start("i")
    await port.release(ReleaseWithDelay(5))
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("pending", False)


@contract("release")
async def test_release_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.release(ReleaseWithDelay(5))
    assert (await side.row("i"))["status"] == "running"


@contract("suspend")
async def test_suspend_registers_the_wait_folding_the_held_back_record(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    port.save_compensation(SaveCompensation(compensation("undo-1")))
    outcome = await port.suspend(SuspendOnTimer("sleep:1", "sleep", None, 60))
    assert outcome is SuspendOutcome.SUSPENDED
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("waiting_for_timer", False)
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]
    assert await side.compensations("i") == ["undo-1"]


@contract("suspend")
async def test_suspend_on_an_event_waits_for_it(side: Side) -> None:
    port = await side.start("i")
    outcome = await port.suspend(SuspendOnEvent("wait:1", "wait", "paid", None, None, None, 60))
    assert outcome is SuspendOutcome.SUSPENDED
    assert (await side.row("i"))["status"] == "waiting_for_event"


@contract("suspend")
async def test_suspend_answers_cancelled_and_keeps_the_lease(side: Side) -> None:
    port = await side.start("i")
    await side.cancel("i")
    assert await port.suspend(SuspendOnTimer("sleep:1", "sleep", None, 60)) is SuspendOutcome.CANCELLED
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("running", True)
    assert port.cancel_requested


@contract("suspend")
async def test_suspend_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    await refused_for_its_lease(port.suspend(SuspendOnTimer("sleep:1", "sleep", None, 60)))
    assert (await side.row("i"))["status"] == "running"


def start_child(step_id: str, child_id: str) -> StartChild:
    return StartChild(step_id, "child", child_id, f"wf-{child_id}", "h", {"n": 2}, "cancel")


@contract("start_child")
async def test_start_child_inserts_the_child_and_records_the_step(side: Side) -> None:
    port = await side.start("parent")
    started = await port.start_child(start_child("child:1", "kid"))
    assert (started.recorded, started.cancel_requested) == (True, False)
    assert await side.exists("kid")
    assert (await side.row("kid"))["status"] == "pending"
    assert await side.history("parent") == [("child:1", CHILD_STARTED)]


@contract("start_child")
async def test_start_child_writes_nothing_when_cancel_was_requested(side: Side) -> None:
    port = await side.start("parent")
    await side.cancel("parent")
    started = await port.start_child(start_child("child:1", "kid"))
    assert (started.recorded, started.cancel_requested) == (False, True)
    assert not await side.exists("kid")
    assert await side.history("parent") == []


@contract("start_child")
async def test_start_child_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("parent")
    await side.steal("parent")
    with pytest.raises(LeaseLostError):
        await port.start_child(start_child("child:1", "kid"))
    assert not await side.exists("kid")


@contract("wait_child")
async def test_wait_child_waits_for_a_running_child(side: Side) -> None:
    port = await side.start("parent")
    await port.start_child(start_child("child:1", "kid"))
    assert await port.wait_child(WaitChild("child:2", "child", "kid")) is SuspendOutcome.SUSPENDED
    row = await side.row("parent")
    assert (row["status"], row["leased"]) == ("waiting_for_event", False)


@contract("wait_child")
async def test_wait_child_takes_an_ended_childs_result(side: Side) -> None:
    port = await side.start("parent")
    await port.start_child(start_child("child:1", "kid"))
    kid = await side.claim("kid")
    assert await kid.complete(Complete({"result": 7}))
    taken = await port.wait_child(WaitChild("child:2", "child", "kid"))
    assert isinstance(taken, HistoryRecord) and taken.kind == EVENT_RECEIVED
    assert taken.payload["data"]["status"] == "completed" and taken.payload["data"]["result"] == 7
    assert (await side.row("parent"))["leased"]  # the lease is kept


@contract("complete")
async def test_complete_ends_the_instance_with_its_result(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    assert await port.complete(Complete({"result": 42})) is True
    row = await side.row("i")
    assert (row["status"], row["result"], row["leased"]) == ("completed", {"result": 42}, False)
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("complete")
async def test_complete_answers_false_when_a_cancel_came_first(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    await side.cancel("i")
    assert await port.complete(Complete({"result": 42})) is False
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("running", True)
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]  # what was held back is written


@contract("complete")
async def test_complete_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.complete(Complete({"result": 42}))
    assert (await side.row("i"))["status"] == "running"


@contract("begin_compensating")
async def test_begin_compensating_keeps_the_error_and_saves_compensations(side: Side) -> None:
    port = await side.start("i")
    port.save_compensation(SaveCompensation(compensation("undo-1")))
    error = {"type": "builtins.ValueError", "message": "no"}
    assert await port.begin_compensating(BeginCompensating(error)) == []
    row = await side.row("i")
    assert (row["status"], row["error"]) == ("compensating", error)
    assert await side.compensations("i") == ["undo-1"]


@contract("begin_compensating")
async def test_begin_compensating_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.begin_compensating(BeginCompensating({"type": "x", "message": "no"}))
    assert (await side.row("i"))["status"] == "running"


@contract("finish")
async def test_finish_ends_failed_or_cancelled(side: Side) -> None:
    error = {"type": "builtins.ValueError", "message": "no"}
    failed = await side.start("failed")
    await failed.finish(Finish(FinalStatus.FAILED, error))
    row = await side.row("failed")
    assert (row["status"], row["error"], row["leased"]) == ("failed", error, False)
    cancelled = await side.start("cancelled")
    await cancelled.finish(Finish(FinalStatus.CANCELLED, None))
    assert (await side.row("cancelled"))["status"] == "cancelled"


@contract("finish")
async def test_finish_a_failed_saga_keeps_the_workflows_error_inside(side: Side) -> None:
    port = await side.start("i")
    workflow_error = {"type": "builtins.ValueError", "message": "no"}
    await port.begin_compensating(BeginCompensating(workflow_error))
    await port.finish(FailSaga({"type": "kenning.errors.CompensationError", "message": "undo failed"}))
    row = await side.row("i")
    assert row["status"] == "failed" and row["error"]["workflow_error"] == workflow_error
    assert row["error"]["message"] == "undo failed"


@contract("finish")
async def test_finish_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.finish(Finish(FinalStatus.FAILED, {"type": "x", "message": "no"}))
    assert (await side.row("i"))["status"] == "running"


def send(step_id: str, to: str, message_id: str, data: Any = "hi") -> SendMessage:
    return SendMessage(record(step_id, MESSAGE_SENT, {"to": to}), to, "greetings", message_id, data)


@contract("send_message")
async def test_send_message_delivers_once_and_records_the_step(side: Side) -> None:
    await side.add("peer")
    port = await side.start("i")
    first = await port.send_message(send("send:1", "peer", "m-1"))
    again = await port.send_message(send("send:2", "peer", "m-1"))  # the same id
    assert (first.refused, again.refused) == (None, None)
    assert first.recipient_status == "pending"
    assert await side.mailbox("peer") == [("greetings", "m-1", "hi")]
    assert await side.history("i") == [("send:1", MESSAGE_SENT), ("send:2", MESSAGE_SENT)]


@contract("send_message")
async def test_send_message_carries_the_held_back_record_before_its_own(side: Side) -> None:
    await side.add("peer")
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    await port.send_message(send("send:1", "peer", "m-1"))
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED), ("send:1", MESSAGE_SENT)]
    assert await side.mailbox("peer") == [("greetings", "m-1", "hi")]


@contract("send_message")
async def test_send_message_after_a_cancel_the_held_back_record_saw_sends_nothing(side: Side) -> None:
    """The cancel a flush before the send would have seen: the record is committed, the
    message is not, and the engine ends the step cancelled (``WorkflowRun.folded``)."""
    await side.add("peer")
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=True))
    await side.cancel("i")
    with pytest.raises(CancelSeenBeforeWrite):
        await port.send_message(send("send:1", "peer", "m-1"))
    assert port.cancel_requested is True
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]
    assert await side.mailbox("peer") == []
    port.discard()
    await port.flush()  # nothing held back any more: written once
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("send_message")
async def test_send_message_to_no_instance_is_refused_with_nothing_written(side: Side) -> None:
    port = await side.start("i")
    sent = await port.send_message(send("send:1", "nobody", "m-1"))
    assert sent.refused is Undelivered.UNKNOWN_INSTANCE
    assert await side.history("i") == []


@contract("send_message")
async def test_send_message_to_a_finished_instance_is_refused(side: Side) -> None:
    done = await side.start("done")
    await done.complete(Complete({"result": None}))
    port = await side.start("i")
    sent = await port.send_message(send("send:1", "done", "m-1"))
    assert (sent.refused, sent.recipient_status) == (Undelivered.FINISHED, "completed")
    assert await side.history("i") == [] and await side.mailbox("done") == []


@contract("subscribe")
async def test_subscribe_records_the_step_and_publishes_reach_it(side: Side) -> None:
    listener = await side.start("listener")
    await listener.subscribe(Subscribe(record("sub:1", CHANNEL_SUBSCRIBED, {"channel": "news"}), "news"))
    assert await side.history("listener") == [("sub:1", CHANNEL_SUBSCRIBED)]
    announcer = await side.start("announcer")
    assert await announcer.publish(Publish(record("pub:1", MESSAGE_SENT, {}), "news", "p-1", "extra")) == 1
    assert await side.mailbox("listener") == [("news", "p-1", "extra")]


@contract("publish")
async def test_publish_answers_how_many_it_reached(side: Side) -> None:
    for listener in ("l-1", "l-2"):
        port = await side.start(listener)
        await port.subscribe(Subscribe(record("sub:1", CHANNEL_SUBSCRIBED, {"channel": "news"}), "news"))
    announcer = await side.start("announcer")
    assert await announcer.publish(Publish(record("pub:1", MESSAGE_SENT, {}), "news", "p-1", 1)) == 2
    assert await announcer.publish(Publish(record("pub:2", MESSAGE_SENT, {}), "quiet", "p-2", 1)) == 0
    assert await side.history("announcer") == [("pub:1", MESSAGE_SENT), ("pub:2", MESSAGE_SENT)]


@contract("receive_message")
async def test_receive_message_takes_the_oldest_message(side: Side) -> None:
    await side.add("receiver")
    sender = await side.start("sender")
    await sender.send_message(send("send:1", "receiver", "m-1", "first"))
    await sender.send_message(send("send:2", "receiver", "m-2", "second"))
    receiver = await side.claim("receiver")
    taken = await receiver.receive_message(ReceiveMessage("recv:1", "recv", "greetings", None))
    assert isinstance(taken, HistoryRecord) and taken.kind == MESSAGE_RECEIVED
    assert (taken.payload["message_id"], taken.payload["data"]) == ("m-1", "first")
    assert await side.mailbox("receiver") == [("greetings", "m-2", "second")]
    assert await side.history("receiver") == [("recv:1", MESSAGE_RECEIVED)]
    assert (await side.row("receiver"))["leased"]


@contract("receive_message")
async def test_receive_message_waits_on_an_empty_mailbox(side: Side) -> None:
    port = await side.start("i")
    assert await port.receive_message(ReceiveMessage("recv:1", "recv", "greetings", 60)) is SuspendOutcome.SUSPENDED
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("waiting_for_message", False)


@contract("receive_message")
async def test_receive_message_answers_cancelled_with_nothing_taken(side: Side) -> None:
    await side.add("i")
    sender = await side.start("sender")
    await sender.send_message(send("send:1", "i", "m-1"))
    port = await side.claim("i")
    await side.cancel("i")
    assert await port.receive_message(ReceiveMessage("recv:1", "recv", "greetings", None)) is SuspendOutcome.CANCELLED
    assert await side.mailbox("i") == [("greetings", "m-1", "hi")]


@contract("receive_message")
async def test_receive_message_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    await refused_for_its_lease(port.receive_message(ReceiveMessage("recv:1", "recv", "greetings", None)))
    assert (await side.row("i"))["status"] == "running"


@contract("reply_message")
async def test_reply_message_keeps_the_first_reply(side: Side) -> None:
    port = await side.start("i")
    first = ReplyMessage(record("reply:1", MESSAGE_REPLIED, {}), "m-1", {"ok": True}, None)
    second = ReplyMessage(record("reply:2", MESSAGE_REPLIED, {}), "m-1", None, "too late")
    assert await port.reply_message(first) is True
    assert await port.reply_message(second) is False
    assert await side.reply("i", "m-1") == ({"ok": True}, None)
    assert await side.history("i") == [("reply:1", MESSAGE_REPLIED)]  # nothing written the second time


@contract("publish_value")
async def test_publish_value_keeps_the_latest_with_its_step(side: Side) -> None:
    port = await side.start("i")
    await port.publish_value(PublishValue(record("pv:1", VALUE_PUBLISHED, {}), "progress", 1, False, None))
    await port.publish_value(PublishValue(record("pv:2", VALUE_PUBLISHED, {}), "progress", 2, False, None))
    assert await side.value("i", "progress") == 2
    assert await side.history("i") == [("pv:1", VALUE_PUBLISHED), ("pv:2", VALUE_PUBLISHED)]


@contract("publish_value")
async def test_publish_value_writes_nothing_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.publish_value(PublishValue(record("pv:1", VALUE_PUBLISHED, {}), "progress", 1, False, None))
    assert await side.value("i", "progress") is None


@contract("write_stream")
async def test_write_stream_appends_at_the_next_offset(side: Side) -> None:
    port = await side.start("i")
    first = await port.write_stream(WriteStream("talk", "a", record("ws:1", STREAM_WRITTEN, {})))
    second = await port.write_stream(WriteStream("talk", "b", None, step_id="act:1", attempt=1))  # from an activity
    assert (first.offset, second.offset) == (0, 1)
    assert (first.step, second.step, second.attempt) == (None, "act:1", 1)
    assert await side.stream("i", "talk") == ["a", "b"]
    assert await side.history("i") == [("ws:1", STREAM_WRITTEN)]


@contract("write_stream")
async def test_write_stream_is_refused_when_the_lease_moved(side: Side) -> None:
    port = await side.start("i")
    await side.steal("i")
    with pytest.raises(LeaseLostError):
        await port.write_stream(WriteStream("talk", "a", None, step_id="act:1", attempt=1))
    assert await side.stream("i", "talk") == []


@contract("close_stream")
async def test_close_stream_refuses_later_writes(side: Side) -> None:
    port = await side.start("i")
    await port.write_stream(WriteStream("talk", "a", None, step_id="act:1", attempt=1))
    await port.close_stream(CloseStream("talk", record("cs:1", STREAM_CLOSED, {})))
    with pytest.raises(StreamClosedError):
        await port.write_stream(WriteStream("talk", "b", None, step_id="act:1", attempt=1))
    await port.close_stream(CloseStream("never-written", None))  # from an activity, at once
    with pytest.raises(StreamClosedError):
        await port.write_stream(WriteStream("never-written", "b", None, step_id="act:1", attempt=1))
    assert await side.stream("i", "talk") == ["a"]
    assert await side.history("i") == [("cs:1", STREAM_CLOSED)]


@contract("continue_as_new")
async def test_continue_as_new_starts_the_next_run_afresh(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=False))
    assert await port.continue_as_new(ContinueAsNew({"n": 2})) == 2
    row = await side.row("i")
    assert (row["run"], row["input"]) == (2, {"n": 2})
    assert await side.history("i") == []


@contract("continue_as_new")
async def test_continue_as_new_keeps_the_lease(side: Side) -> None:
    port = await side.start("i")
    assert await port.continue_as_new(ContinueAsNew({"n": 2})) == 2
    row = await side.row("i")
    assert (row["status"], row["leased"]) == ("running", True)
    await port.record_step(RecordStep(record("a:1"), defer=False))  # the next run goes on with it
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]


@contract("continue_as_new")
async def test_continue_as_new_writes_nothing_when_cancel_was_requested(side: Side) -> None:
    port = await side.start("i")
    await port.record_step(RecordStep(record("a:1"), defer=False))
    await side.cancel("i")
    assert await port.continue_as_new(ContinueAsNew({"n": 2})) is None
    row = await side.row("i")
    assert (row["run"], row["input"], row["leased"]) == (1, {"n": 1}, True)
    assert await side.history("i") == [("a:1", ACTIVITY_COMPLETED)]
    assert port.cancel_requested
