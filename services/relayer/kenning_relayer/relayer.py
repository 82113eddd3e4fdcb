"""``Relayer``: drains the outbox to the broker, one leased batch at a time.

A batch is claimed in one statement (``FOR UPDATE SKIP LOCKED``, a lease token and
expiry, at most one event per workflow instance so each instance's events go out in
creation order), published concurrently to the target the broker URL names (HTTP, AMQP or
NATS JetStream: ``targets.py``), one outcome per event so a slow or failing event holds
up no other, and its outcomes are written back in one fenced statement. A heartbeat
extends the lease while the batch is in flight; a relayer that dies leaves rows whose
lease expires and the next claim takes them. Wakes on ``NOTIFY kenning_outbox``, polls as
a fallback, and deletes published rows past the retention period in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import structlog

from kenning.core.names import CHANNEL_OUTBOX
from kenning.core.urls import hide_credentials
from kenning.db import Database
from kenning.db.errors import is_unavailable
from kenning.hosting.config import process_id
from kenning.hosting.passloop import PassLoop, listening
from kenning.hosting.presence import Presence
from kenning.observability import metrics, tracing
from kenning.observability.faults import fault_point
from kenning.storage import outbox as outbox_sql
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer.publish import RetrySchedule
from kenning_relayer.settings import RelayerSettings
from kenning_relayer.targets import Target, open_target

_log = structlog.get_logger("kenning.relayer")
# an event whose data this relayer cannot open (a key it lacks) is offered again after this
UNREADABLE_RETRY_SECONDS = 5.0


class Relayer:
    def __init__(
        self, database: Database, settings: RelayerSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.database = database
        self.settings = settings
        self.relayer_id = settings.relayer_id or process_id("relayer-")
        self.schedule = RetrySchedule(settings.max_attempts, settings.retry_initial_seconds, settings.retry_max_seconds)
        self._transport = transport
        self._unreadable_told: set[str] = set()  # each key problem logged once as an error
        self._target: Target | None = None
        self.log = _log.bind(relayer_id=self.relayer_id)
        self.loop = PassLoop(
            self._pass, log=self.log, failed_event="relayer.claim_failed", retry_seconds=settings.poll_interval
        )
        # its entry in the fleet's registry (`kenning workers list`)
        self.presence = Presence(
            database,
            kind="relayer",
            process_id=self.relayer_id,
            interval=settings.presence_interval,
            commit_stall_seconds=settings.commit_stall_seconds,
            details=lambda: {"broker": hide_credentials(settings.broker_url), "batch_size": settings.batch_size},
        )

    def stop(self) -> None:
        """Stop claiming; the batch in flight gets the grace period, then is released."""
        self.loop.stop()

    def _notify(self, channel: str) -> None:
        self.loop.wake()

    async def run(self) -> None:
        try:
            # unreachable database: no error, the loop's polls retry it
            async with (
                self.presence.running(),
                listening(
                    self.database.listen_url,
                    [CHANNEL_OUTBOX],
                    self._notify,
                    enabled=self.settings.listen,
                    connected_within=5,
                    parameters=self.database.client_parameters,
                ),
            ):
                await self._publishing()
        finally:
            self.log.info("relayer.stopped")

    async def _publishing(self) -> None:
        cleanup: asyncio.Task[None] | None = None
        target = open_target(self.settings, self.schedule, self._transport)
        try:
            self._target = target
            cleanup = asyncio.create_task(self._cleanup_loop(), name="kenning-outbox-cleanup")
            self.log.info(
                "relayer.started",
                broker_url=hide_credentials(self.settings.broker_url),
                content_mode=self.settings.content_mode,
                batch_size=self.settings.batch_size,
                listen=self.settings.listen,
            )
            await self.loop.run()
        finally:
            if cleanup is not None:
                cleanup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await cleanup
            self._target = None
            await target.close()

    async def _pass(self) -> float:
        if await self.publish_batch():
            return 0.0  # more may be due, and each instance's next event is now free
        return await self._seconds_until_next()

    async def _seconds_until_next(self) -> float:
        try:
            async with self.database.connection() as conn:
                until = await outbox_sql.outbox_seconds_until_next(conn)
        except Exception:
            return self.settings.poll_interval
        if until is None:
            return self.settings.poll_interval
        return min(self.settings.poll_interval, max(until, 0.001))

    async def publish_batch(self) -> int:
        """Claim one batch, publish it and record the outcomes; returns how many rows were
        claimed (0: nothing was due)."""
        if self._target is None:
            raise RuntimeError("Relayer.publish_batch needs a running relayer (Relayer.run)")
        token = str(uuid.uuid4())
        async with self.database.connection() as conn:  # one statement: its own transaction
            rows = await outbox_sql.outbox_claim_pending(
                conn,
                owner=self.relayer_id,
                token=token,
                limit=self.settings.batch_size,
                lease_seconds=self.settings.lease_seconds,
            )
        if not rows:
            return 0
        self.log.debug("outbox.claimed", count=len(rows), lease_token=token)
        claimed = len(rows)
        unreadable = [r for r in rows if r.unreadable is not None]
        if unreadable:
            await self._give_back_unreadable(token, unreadable)
            rows = [r for r in rows if r.unreadable is None]
            if not rows:
                return claimed
        outcomes = await self._publish(self._target, rows, token)
        fault_point("relayer.after_send")
        await self._record(rows, token, outcomes)
        return len(rows)

    async def _give_back_unreadable(self, token: str, rows: Sequence[OutboxRow]) -> None:
        """Events whose data this relayer cannot open (a key it lacks): handed back
        uncounted, due again after a delay, for a relayer with the key; never dead-lettered
        for it. Each reason is logged as an error once, then at debug."""
        for row in rows:
            reason = row.unreadable or ""
            fields = {"event_id": row.id, "event_type": row.event_type, "error": reason}
            if reason in self._unreadable_told:
                self.log.debug("outbox.unreadable", **fields)
                continue
            self._unreadable_told.add(reason)
            self.log.error(
                "outbox.unreadable",
                hint="handed back, not dead-lettered: give this relayer KENNING_ENCRYPTION_KEYS",
                **fields,
            )
        try:
            async with self.database.connection() as conn:
                await outbox_sql.outbox_release(conn, token, [r.id for r in rows], UNREADABLE_RETRY_SECONDS)
        except Exception as error:  # their lease expires and a later claim takes them again
            self.log.warning("outbox.release_failed", error=repr(error), count=len(rows))

    async def _publish(self, target: Target, rows: Sequence[OutboxRow], token: str) -> list[OutboxOutcome]:
        outcomes: list[OutboxOutcome] = []

        async def one(row: OutboxRow) -> None:
            span = tracing.relay_span(row.event_type, row.id, row.extensions)
            outcome = await target.deliver(row)
            tracing.end_span(span, outcome=outcome.status)
            outcomes.append(outcome)

        batch = asyncio.gather(*(one(row) for row in rows))
        heartbeat = asyncio.create_task(self._heartbeat(token, [r.id for r in rows]), name="kenning-outbox-heartbeat")
        stopping = asyncio.create_task(self.loop.stopped())
        try:
            waiters: set[asyncio.Future[Any]] = {batch, stopping}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not batch.done():
                self.log.info("relayer.draining", in_flight=len(rows) - len(outcomes))
                await asyncio.wait({batch}, timeout=self.settings.shutdown_grace_seconds)
        finally:
            for task in (batch, heartbeat, stopping):
                task.cancel()
            for task in (batch, heartbeat, stopping):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return outcomes

    async def _heartbeat(self, token: str, ids: Sequence[str]) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            try:
                async with self.database.connection() as conn:
                    await outbox_sql.outbox_extend_lease(conn, token, ids, self.settings.lease_seconds)
            except Exception as error:
                self.log.warning("relayer.heartbeat_failed", error=repr(error))

    async def _record(self, rows: Sequence[OutboxRow], token: str, outcomes: Sequence[OutboxOutcome]) -> None:
        """Write the batch's outcomes and hand back what was not attempted. Retried for up to
        half a lease if the database is briefly unreachable; after that the rows are
        re-sent once their lease expires (at-least-once)."""
        attempted = {o.id for o in outcomes}
        unattempted = [r.id for r in rows if r.id not in attempted]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lease_seconds / 2
        delay = 0.05
        while True:
            try:
                async with self.database.transaction() as conn:
                    written = await outbox_sql.outbox_record_outcomes(conn, token, outcomes)
                    released = await outbox_sql.outbox_release(conn, token, unattempted)
                break
            except Exception as error:
                if loop.time() + delay > deadline:
                    # The rows stay leased, and are sent again once the lease ends: a
                    # duplicate, within at-least-once. Only an error that is not the
                    # database being away needs a person.
                    report = self.log.warning if is_unavailable(error) else self.log.error
                    report("outbox.record_failed", error=repr(error), count=len(outcomes), then="resent_after_lease")
                    return
                self.log.warning("outbox.record_retry", error=repr(error), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        by_id = {r.id: r for r in rows}
        for outcome in outcomes:
            row = by_id[outcome.id]
            fields = {"event_id": row.id, "event_type": row.event_type, "attempt": row.attempts}
            if outcome.id not in written:
                self.log.warning("outbox.lease_lost", **fields)
            elif outcome.status == "published":
                metrics.OUTBOX_DELIVERIES.labels("published").inc()
                self.log.debug("outbox.published", **fields)
            elif outcome.status == "pending":
                metrics.OUTBOX_DELIVERIES.labels("retry").inc()
                self.log.info(
                    "outbox.retry_scheduled", retry_in=round(outcome.retry_in, 3), error=outcome.error, **fields
                )
            else:
                metrics.OUTBOX_DELIVERIES.labels("dead_letter").inc()
                self.log.warning("outbox.dead_lettered", error=outcome.error, **fields)
        if released:
            self.log.info("outbox.released", count=released)

    async def _cleanup_loop(self) -> None:
        retention = self.settings.retention_hours * 3600
        while True:
            try:
                deleted = 0
                while True:
                    async with self.database.connection() as conn:
                        n = await outbox_sql.outbox_delete_published(
                            conn, retention_seconds=retention, limit=self.settings.cleanup_batch_size
                        )
                    deleted += n
                    if n < self.settings.cleanup_batch_size:
                        break
                if deleted:
                    self.log.info("outbox.cleaned", deleted=deleted)
            except Exception as error:
                self.log.warning("outbox.cleanup_failed", error=repr(error))
            await asyncio.sleep(self.settings.cleanup_interval_seconds)
