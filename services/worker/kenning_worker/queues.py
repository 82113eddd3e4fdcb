"""The queues a worker serves: their declarations written at start, their names read
again on every poll and on CHANNEL_QUEUES (a start created a queue or named a workflow
in one), and one queued claim per queue in each claim pass.

The limits live in the database and are enforced by the claim statement
(``kenning/storage/queues.py``); what is here only decides which queues to ask, in which
order: the plain claim and the queues take turns going first, so a backlog in one never
takes every slot of every pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from kenning.app import App
from kenning.db import Database, Executor
from kenning.observability import metrics
from kenning.storage import claims as claims_sql
from kenning.storage import queues as queues_sql
from kenning.storage.claims import Claim
from kenning.storage.queues import QueueLimits

# When a queue's claim found it held by another worker's claim: try again this soon.
BUSY_RETRY_SECONDS = 0.02


class ClaimArgs(TypedDict):
    """What one claim of a pass asks for: the plain claim's and each queue's alike."""

    owner: str
    workflow_names: Sequence[str]
    limit: int
    lease_seconds: float
    max_runs: int
    take_suspect: bool
    code_version: str  # the worker's: it takes instances pinned to it, and pins its pinned workflows'
    pinned: Sequence[str]


@dataclass
class QueuePass:
    """What one claim pass took from the queues."""

    claims: list[Claim] = field(default_factory=list)
    seconds_until_next: float | None = None  # the soonest a queue may admit more (rate, busy)
    tokens: set[str] = field(default_factory=set)  # leases of queued instances claimed

    def sooner(self, seconds: float | None) -> None:
        if seconds is not None and (self.seconds_until_next is None or seconds < self.seconds_until_next):
            self.seconds_until_next = seconds


class WorkerQueues:
    def __init__(self, database: Database, app: App, *, log: Any) -> None:
        self.database = database
        self.log = log
        self.declared = [
            QueueLimits(
                name=q.name,
                concurrency=q.concurrency,
                worker_concurrency=q.worker_concurrency,
                rate_limit=q.rate_count,
                rate_period_seconds=q.rate_period_seconds,
                partition_concurrency=q.key_limit,
                partition_strategy=q.partition_strategy,
                key_rate_limit=None if (per_key := q.partition_rate_limit) is None else per_key.limit,
                key_rate_period_seconds=None if per_key is None else float(per_key.period),
            )
            for q in app.registry.queues.values()
        ]
        # queues its workflows name: served from the start, before the first read
        self.names: list[str] = sorted(
            {q.name for q in self.declared} | {w.queue for w in app.registry.workflows.values() if w.queue}
        )
        self.queue_label = metrics.BoundedLabel()
        self.stale = True  # read the names again before the next claim (polls, CHANNEL_QUEUES)
        self.turn = 0  # which source goes first in the next pass (0: the plain claim)

    async def declare(self) -> None:
        """Write this worker's queue declarations (their limits) before it claims."""
        if not self.declared:
            return
        try:
            async with self.database.connection() as conn:
                await queues_sql.queues_declare(conn, self.declared)
        except Exception as error:  # the claim pass reports a database that does not answer
            self.log.warning("worker.queues_not_declared", error=repr(error))
        else:
            self.log.info("worker.queues_declared", queues=[q.name for q in self.declared])

    def order(self) -> list[str | None]:
        """The sources of this pass: None is the plain claim, then each queue, rotated."""
        sources: list[str | None] = [None, *self.names]
        start = self.turn % len(sources)
        self.turn += 1
        return sources[start:] + sources[:start]

    async def refresh(self, conn: Executor, workflow_names: list[str]) -> None:
        """Read again which queues hold this worker's workflows: only those are claimed
        from (a queue of other workers' workflows would only cost its claims' lock)."""
        if not self.stale:
            return
        # cleared before the read: a CHANNEL_QUEUES arriving while it runs (its snapshot
        # may predate that start) makes the next pass read again
        self.stale = False
        try:
            self.names = sorted(set(await queues_sql.queue_names(conn, workflow_names)) | set(self.names))
        except BaseException:
            self.stale = True
            raise

    async def claim(self, conn: Executor, queue: str, asked: ClaimArgs, *, into: QueuePass) -> Claim:
        started = time.perf_counter()
        claim = await claims_sql.queue_claim(conn, queue=queue, **asked)
        metrics.CLAIM_DURATION.observe(time.perf_counter() - started)
        if claim.rate_limited:
            metrics.QUEUE_KEY_RATE_LIMITED.labels(queue=self.queue_label(queue)).inc(claim.rate_limited)
        into.claims.append(claim)
        into.tokens.update(c.lease_token for c in claim.instances)
        into.sooner(BUSY_RETRY_SECONDS if claim.busy else claim.seconds_until_next)
        return claim
