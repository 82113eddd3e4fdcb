"""``Worker``: claims runnable instances in batches, runs each under a lease.

One claim statement takes many instances (``FOR UPDATE SKIP LOCKED``), expired leases
included; a heartbeat extends the leases of everything in flight and cancels the runs
whose lease was taken over. Wakes on ``NOTIFY``, polls as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import structlog

from kenning.app import App
from kenning.config import process_id
from kenning.db import Database
from kenning.listener import Listener
from kenning.replay import Replayer
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage.records import ClaimedInstance, CompensationRecord, HistoryRecord
from kenning.storage.tables import CHANNEL_INBOX, CHANNEL_INSTANCES, CHANNEL_SUBSCRIPTIONS
from kenning.worker.inbox import InboxProcessor, InboxSettings

_log = structlog.get_logger("kenning.worker")


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 32
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    inline_retry_seconds: float = 5.0
    shutdown_grace_seconds: float = 30.0
    listen: bool = True
    worker_id: str = ""
    inbox: InboxSettings = field(default_factory=InboxSettings)


class Worker:
    def __init__(self, database: Database, app: App, settings: WorkerSettings | None = None) -> None:
        self.database = database
        self.app = app
        self.settings = settings or WorkerSettings()
        self.worker_id = self.settings.worker_id or process_id()
        self.workflow_names = sorted(app.registry.workflows)
        self._running: dict[str, asyncio.Task[None]] = {}  # lease token -> run
        self._wake = asyncio.Event()
        # Whether another claim may find work: set by NOTIFY and polls, and after a claim
        # that filled every free slot; a finished run frees a slot but brings no new work.
        self._work_likely = True
        self._stopping = asyncio.Event()
        self.log = _log.bind(worker_id=self.worker_id)
        self.inbox = InboxProcessor(
            database,
            app,
            self.settings.inbox,
            worker_id=self.worker_id,
            poll_interval=self.settings.poll_interval,
            lease_seconds=self.settings.lease_seconds,
        )

    def stop(self) -> None:
        """Stop claiming; in-flight runs get the grace period to finish (SIGTERM)."""
        self._stopping.set()
        self._wake.set()
        self.inbox.stop()

    def _notify(self, channel: str) -> None:
        if channel in (CHANNEL_INBOX, CHANNEL_SUBSCRIPTIONS):
            self.inbox.wake()
        else:
            self._work_likely = True
            self._wake.set()

    async def run(self) -> None:
        if not self.workflow_names:
            self.log.warning("worker.no_workflows", hint="--app must name the modules that define workflows")
        channels = [CHANNEL_INSTANCES]
        if self.settings.inbox.enabled:
            channels += [CHANNEL_INBOX, CHANNEL_SUBSCRIPTIONS]
        listener = Listener(self.database.url, channels, self._notify) if self.settings.listen else None
        if listener is not None:
            await listener.start()
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="kenning-heartbeat")
        inbox = asyncio.create_task(self.inbox.run(), name="kenning-inbox") if self.settings.inbox.enabled else None
        self.log.info("worker.started", workflows=self.workflow_names, concurrency=self.settings.concurrency)
        try:
            await self._claim_loop()
        finally:
            self.inbox.stop()
            if inbox is not None:
                await inbox  # it finishes the row in hand and gives the rest back
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            if listener is not None:
                await listener.stop()
            self.log.info("worker.stopped")

    async def _claim_loop(self) -> None:
        # Claims are batched: the NOTIFYs of many starts and the ends of many runs coalesce
        # into one claim of every free slot, so empty claims do not cost a commit per start
        # per worker. Saturated (the last claim filled every slot), it refills a quarter of
        # its slots at a time.
        claim_spacing = min(0.005, self.settings.poll_interval)
        refill_at = max(1, self.settings.concurrency // 4)
        saturated = False
        while not self._stopping.is_set():
            self._wake.clear()
            free = self.settings.concurrency - len(self._running)
            sleep_for = self.settings.poll_interval
            wanted = self._work_likely and free > 0 and (not saturated or free >= refill_at)
            if wanted and self.workflow_names:
                self._work_likely = False
                try:
                    claimed = await self._claim(free)
                except Exception as error:  # database down: keep trying, never crash the loop
                    self.log.warning("worker.claim_failed", error=repr(error))
                    claimed, sleep_for, self._work_likely = 0, min(self.settings.poll_interval, 1.0), True
                saturated = claimed == free
                if saturated:
                    self._work_likely = True
                elif claimed == 0:
                    sleep_for = await self._seconds_until_next()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(sleep_for, 0.001))
            except TimeoutError:
                self._work_likely, saturated = True, False  # a poll, or the next run-after time
                continue
            await asyncio.sleep(claim_spacing)  # let more wake-ups arrive: one claim for all

    async def _seconds_until_next(self) -> float:
        try:
            async with self.database.autocommit.connect() as conn:
                until = await instances_sql.instance_seconds_until_next(conn, self.workflow_names)
        except Exception:
            return self.settings.poll_interval
        if until is None:
            return self.settings.poll_interval
        return min(self.settings.poll_interval, max(until, 0.001))

    async def _claim(self, limit: int) -> int:
        # Autocommit: the claim is one statement (its own transaction), the loads are reads.
        async with self.database.autocommit.connect() as conn:
            claimed = await instances_sql.instance_claim_runnable(
                conn,
                owner=self.worker_id,
                workflow_names=self.workflow_names,
                limit=limit,
                lease_seconds=self.settings.lease_seconds,
            )
            # Fresh instances have no history: skip the load for them.
            resumed = [c.id for c in claimed if c.run_count > 1 or c.status == "compensating"]
            histories = await history_sql.history_load(conn, resumed)
            compensating = [c.id for c in claimed if c.status == "compensating" or c.cancel_requested]
            compensations = await history_sql.compensations_load(conn, compensating)
        for instance in claimed:
            self.log.debug("instance.claimed", instance_id=instance.id, workflow=instance.workflow_name)
            task = asyncio.create_task(
                self._execute(instance, histories.get(instance.id, []), compensations.get(instance.id, [])),
                name=f"kenning-instance-{instance.id}",
            )
            self._running[instance.lease_token] = task
        return len(claimed)

    async def _execute(
        self, claimed: ClaimedInstance, history: list[HistoryRecord], compensations: list[CompensationRecord]
    ) -> None:
        log = self.log.bind(instance_id=claimed.id, workflow=claimed.workflow_name)
        replayer = Replayer(
            db=self.database,
            app=self.app,
            workflow=self.app.registry.workflow(claimed.workflow_name),
            claimed=claimed,
            history=history,
            compensations=compensations,
            inline_retry_seconds=self.settings.inline_retry_seconds,
        )
        try:
            outcome = await replayer.run()
            log.debug("instance.run_ended", outcome=outcome)
        except asyncio.CancelledError:
            await self._release(claimed, log)
        except Exception as error:
            log.exception("instance.run_crashed", error=repr(error))
            await self._release(claimed, log, delay=1.0)
        finally:
            self._running.pop(claimed.lease_token, None)
            self._wake.set()

    async def _release(self, claimed: ClaimedInstance, log: Any, delay: float = 0.0) -> None:
        """Hand the instance back (shutdown or crash) so another worker need not wait for
        the lease to expire; a lease already lost makes this a no-op."""
        try:
            async with self.database.engine.begin() as conn:
                released = await instances_sql.instance_release(conn, claimed.id, claimed.lease_token, delay)
            if released:
                log.info("instance.released")
        except Exception as error:
            log.warning("instance.release_failed", error=repr(error))

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            tokens = list(self._running)
            if not tokens:
                continue
            try:
                async with self.database.engine.begin() as conn:
                    lost = await instances_sql.instance_heartbeat(conn, tokens, self.settings.lease_seconds)
            except Exception as error:
                self.log.warning("worker.heartbeat_failed", error=repr(error))
                continue
            for token in lost:
                task = self._running.get(token)
                if task is not None:
                    self.log.warning("instance.lease_lost", lease_token=token)
                    task.cancel()

    async def _drain(self) -> None:
        if not self._running:
            return
        tasks = list(self._running.values())
        self.log.info("worker.draining", in_flight=len(tasks), grace=self.settings.shutdown_grace_seconds)
        _, still_running = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_seconds)
        for task in still_running:
            task.cancel()
        if still_running:
            await asyncio.wait(still_running)
