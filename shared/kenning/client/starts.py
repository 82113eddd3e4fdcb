"""Inserting starts: the one insert a client's ``start()``, an event that starts a workflow
(the inbox processor) and a cron tick (the scheduler) all reach, after
``kenning.starting.prepare_start`` checked the start.

- ``start_on`` inserts it on a connection the caller holds: inside its transaction (the
  inbox: the start commits with the event row marked processed) or as one autocommit
  statement (a cron tick);
- ``Starter.start`` inserts it through a group commit on the pool (a client: concurrent
  starts share one insert, one commit and one NOTIFY; NOTIFY serialises commits
  server-side, so one per batch is what lets starts scale).

Either way the insert and the NOTIFY that wakes the workers are one statement
(``instances.instances_start``), and a start whose id or idempotency key exists already
returns the existing instance (``created=False``).

A ``Starter`` sends at most one NOTIFY per ``ANNOUNCE_SPACING`` during a burst: every
listening backend (one per worker) pays a transaction for each NOTIFY it receives, and a
burst of starts needs the workers woken once, not once per batch. A lone start (one
caller starting one workflow at a time) and the first batch after the spacing carry
their NOTIFY at once; a batch of several starts, or one queued behind the insert
before it, inside the spacing goes without, and one NOTIFY at the spacing's end
announces it (``instances.instances_announce``), so no start waits longer than the
spacing to be announced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from kenning.client.folding import fold_on, folds
from kenning.core.cancelling import cancel_and_wait
from kenning.core.records import NewInstance, StartOutcome
from kenning.db import Database, Executor
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.observability import metrics
from kenning.starting import DefinitionKey, Start, StartedInstance
from kenning.storage import definitions as definitions_sql
from kenning.storage import instances as instances_sql
from kenning.storage import strategies as strategies_sql

_log = structlog.get_logger("kenning.starting")

# The least time between two NOTIFYs of one Starter's starts (seconds): the longest a start
# waits to be announced. With 4 workers a NOTIFY per group-committed batch cost 0.5
# listener transactions per workflow, as much as all the other commits of the workflow.
ANNOUNCE_SPACING = 0.03


async def start_on(
    conn: Executor,
    start: Start,
    *,
    known: set[DefinitionKey],
    registered: list[DefinitionKey] | None = None,
) -> StartedInstance | None:
    """Insert ``start`` on ``conn``: its definition row first unless in ``known``, then
    the instance, which wakes the workers. None: not started because its ``not_before``
    predates the workflow's first sighting (a cron tick from before its schedule).

    Inside a transaction pass ``registered``: the definitions written are listed there
    for the caller to add to ``known`` once it committed; without it they are added to
    ``known`` at once (the statement committed on its own). A debounced start or a
    batched event is folded into its key's burst (``kenning.client.folding``): inside
    a transaction only."""
    if folds(start):
        assert registered is not None, "a folded start joins the caller's transaction"
        return await fold_on(conn, start, known=known, registered=registered)
    key = start.definition_key
    if start.definition is not None and key is not None and key not in known:
        await definitions_sql.definitions_register(conn, [start.definition])
        (known.add if registered is None else registered.append)(key)
    decisions: list[tuple[str, str]] = []
    (outcome,) = await instances_sql.instances_start(conn, [start.instance], decisions=decisions)
    count_decisions(decisions)
    return await _started(conn, start, outcome)


_queue_label = metrics.BoundedLabel()


def count_decisions(decisions: list[tuple[str, str]]) -> None:
    """Count the starts a queue's partition strategy decided (kenning/storage/strategies.py)."""
    for queue, strategy in decisions:
        metrics.QUEUE_STRATEGY_STARTS.labels(queue=_queue_label(queue), strategy=strategy).inc()


async def _started(conn: Executor, start: Start, outcome: StartOutcome) -> StartedInstance | None:
    if outcome is StartOutcome.BEFORE_SCHEDULE:
        return None
    if outcome is StartOutcome.STARTED:
        return StartedInstance(start.instance.instance_id, True)
    if outcome is StartOutcome.CANCELLED:  # its key at its limit (cancel_newest): ended already
        return StartedInstance(start.instance.instance_id, True, cancelled=True)
    new = start.instance
    if outcome is StartOutcome.JOINED and new.queue_name is not None:  # a singleton key's open instance
        joined = await strategies_sql.key_open_instance(conn, new.queue_name, new.partition_key or "")
        if joined is not None:
            return StartedInstance(joined, False)
    existing = await instances_sql.instance_find_existing(conn, new.instance_id, new.workflow_name, new.idempotency_key)
    return StartedInstance(existing, False)


class Starter:
    """The starts of one process that start instances on the pool (a ``Client``):
    concurrent ``start`` calls share one insert statement (group commit), and their
    NOTIFYs are spaced by ``announce_spacing`` (the module's docstring); ``close``
    announces what is still unannounced."""

    def __init__(self, database: Database, *, announce_spacing: float = ANNOUNCE_SPACING) -> None:
        self.database = database
        self.known: set[DefinitionKey] = set()
        self.inserts: GroupCommit[NewInstance, StartOutcome] = GroupCommit(
            write=self._insert, retry_alone=may_be_one_callers_fault, name="starts"
        )
        self.announce_spacing = announce_spacing
        self.announcements = 0  # NOTIFYs sent (inserts that carried one, and announcements after)
        self._announced_at = float("-inf")  # loop time of the last NOTIFY
        self._unannounced = False  # starts committed since then without a NOTIFY
        # An insert and the later announcement never overlap: an insert committing after
        # the NOTIFY meant to announce it would wait for the workers' poll.
        self._writing = asyncio.Lock()
        self._inserts_waiting = 0  # inserts waiting for _writing
        # True from the end of an insert until the event loop's next turn: an insert that
        # starts meanwhile is the group commit's next batch, queued behind it (a burst)
        self._inserted_just_now = False
        self._announcer: asyncio.Task[None] | None = None

    async def _insert(self, starts: Sequence[NewInstance]) -> list[StartOutcome]:
        queued_behind = self._inserted_just_now
        self._inserts_waiting += 1
        async with self._writing:
            self._inserts_waiting -= 1
            loop = asyncio.get_running_loop()
            now = loop.time()
            alone = len(starts) == 1 and not queued_behind
            notify = alone or now >= self._announced_at + self.announce_spacing
            try:
                decisions: list[tuple[str, str]] = []
                async with self.database.connection() as conn:
                    outcomes = await instances_sql.instances_start(conn, starts, notify=notify, decisions=decisions)
                count_decisions(decisions)
            finally:
                self._inserted_just_now = True
                loop.call_soon(self._settled)
            if StartOutcome.STARTED in outcomes:  # else nothing new, and no NOTIFY was sent
                if notify:
                    self.announcements += 1
                    self._announced_at, self._unannounced = now, False
                else:
                    self._unannounced = True
            if self._unannounced and self._announcer is None:
                self._announcer = asyncio.create_task(self._announce_later(), name="kenning-starts-announce")
            return outcomes

    def _settled(self) -> None:
        self._inserted_just_now = False

    async def _announce_later(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._announced_at + self.announce_spacing - loop.time()))
        async with self._writing:
            self._announcer = None  # an insert from now on schedules the next one
            if self._inserts_waiting:
                # the next batch is on its way: its insert carries the NOTIFY, one commit
                # fewer than a NOTIFY of its own (it schedules this again if it inserts nothing)
                self._announced_at = float("-inf")
                return
            await self._announce()

    async def _announce(self) -> None:
        """Under ``_writing``: one NOTIFY for the starts inserted without one, if any."""
        if not self._unannounced:
            return  # an insert after the spacing carried the NOTIFY
        self._unannounced = False
        try:
            async with self.database.connection() as conn:
                await instances_sql.instances_announce(conn)
        except Exception as error:  # the workers' poll finds the starts
            _log.warning("starts.announce_failed", error=repr(error))
            return
        self.announcements += 1
        self._announced_at = asyncio.get_running_loop().time()

    async def close(self) -> None:
        """Announce at once the starts still waiting for their NOTIFY."""
        announcer, self._announcer = self._announcer, None
        if announcer is not None:
            await cancel_and_wait(announcer)
        async with self._writing:
            await self._announce()

    async def start(self, start: Start) -> StartedInstance | None:
        if folds(start):  # its own transaction: the key's lock, the join or the new burst
            registered: list[DefinitionKey] = []
            async with self.database.transaction() as conn:
                started = await fold_on(conn, start, known=self.known, registered=registered)
            self.known.update(registered)
            return started
        key = start.definition_key
        if start.definition is not None and key is not None and key not in self.known:
            async with self.database.connection() as conn:
                await definitions_sql.definitions_register(conn, [start.definition])
            self.known.add(key)
        (outcome,) = await self.inserts.store([start.instance])
        if outcome is StartOutcome.STARTED:  # the common case: no second round trip
            return StartedInstance(start.instance.instance_id, True)
        async with self.database.connection() as conn:
            return await _started(conn, start, outcome)
