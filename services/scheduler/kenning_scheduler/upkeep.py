"""The scheduler's upkeep between its timer passes: the stuck check and retention.

Both run on the scheduler's pass loop at their own interval, each a bounded amount of
work per pass (one statement for the stuck check, one batch of each kind for retention)
so that timers keep firing on time while a large backlog of expired rows drains: a full
batch asks for the next pass at once.

The stuck check (``kenning.storage.progress.stuck_repair``) logs one warning per instance
it repairs or marks, with ``instance_id`` and ``workflow`` bound; the reason of a marked
one is shown by ``kenning instances show`` and ``kenning why``. It also reports, per
workflow, instances that have a way forward nobody takes: due for longer than
``--overdue-seconds`` and not claimed (``instances.overdue``), at most once per that period,
and each instance whose lease expired while a live transaction still locks its row
(``instance.lease_locked``, naming the server backend that holds it; counted in
``kenning_leases_locked_past_expiry_total``): a process cut off mid-transaction, whose
instances no claim takes over until the server ends that session. On the overdue report's
period it also reports, per workflow and version, instances due as long and pinned to a
code version no live worker runs (``instances.version_gone``; the gauge
``kenning_pinned_instances_without_worker``): nothing claims them until one does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kenning.db import Database
from kenning.errors import ObjectStoreError
from kenning.hosting.objects import delete_instances_objects, sweep_orphans
from kenning.hosting.retention import RetentionPolicy, SweepResult, sweep_batch
from kenning.objects import Location
from kenning.observability import metrics
from kenning.storage import locks as locks_sql
from kenning.storage import progress as progress_sql

# Statement bound of the stuck check: instances repaired or marked per pass.
_STUCK_BATCH = 100


class ObjectUpkeep:
    """The object store's share of the upkeep (``kenning.hosting.objects``): an expired
    instance's objects deleted with its rows, and the orphan sweep at its own interval.

    A store that fails is one error line naming what to fix; the timers go on, and what
    was not deleted is found by the next sweep (no row references it any more)."""

    def __init__(self, location: Location, *, interval: float, grace: float, log: Any) -> None:
        self.location = location
        self.interval = interval
        self.grace = grace
        self.log = log
        self._next_sweep = 0.0  # monotonic: at the first pass

    @classmethod
    def configured(cls, settings: Any, log: Any) -> ObjectUpkeep | None:
        if not settings.object_store:
            return None
        return cls(
            Location.parse(settings.object_store),
            interval=settings.object_sweep_interval,
            grace=settings.object_sweep_grace,
            log=log,
        )

    async def expired(self, database: Database, instance_ids: Sequence[str]) -> None:
        try:
            deleted = await delete_instances_objects(database, self.location, instance_ids)
        except ObjectStoreError as error:
            self.log.error("retention.objects_failed", error=str(error), instances=len(instance_ids))
            return
        if deleted:
            self.log.info("retention.objects_deleted", objects=deleted, instances=len(instance_ids))

    async def run_due(self, database: Database, now: float) -> float:
        """The orphan sweep if due; when the next one is (monotonic)."""
        if now >= self._next_sweep:
            self._next_sweep = now + self.interval
            try:
                swept = await sweep_orphans(database, self.location, grace_seconds=self.grace)
            except ObjectStoreError as error:
                self.log.error("objects.sweep_failed", error=str(error))
            else:
                if swept:
                    self.log.info("objects.swept", objects=swept)
        return self._next_sweep


class Upkeep:
    def __init__(
        self,
        database: Database,
        *,
        stuck_check_interval: float,
        max_repairs: int,
        overdue_seconds: float,
        retention: RetentionPolicy,
        retention_interval: float,
        log: Any,
        objects: ObjectUpkeep | None = None,
    ) -> None:
        self.objects = objects
        self.database = database
        self.stuck_check_interval = stuck_check_interval
        self.max_repairs = max_repairs
        self.overdue_seconds = overdue_seconds
        self._next_overdue_report = 0.0  # monotonic
        self.retention = retention
        self.retention_interval = retention_interval
        self.log = log
        self._next_check = 0.0  # monotonic: at the first pass
        self._next_sweep = 0.0
        self._swept = SweepResult()  # deleted since the sweep began (logged once it ends)

    async def run_due(self) -> float:
        """Run what is due; returns the seconds until something is due again (0: more
        was found than one batch holds)."""
        now = time.monotonic()
        if now >= self._next_check:
            full = await self.check_progress()
            self._next_check = now if full else now + self.stuck_check_interval
        if now >= self._next_sweep:
            batch = await sweep_batch(self.database, self.retention)
            if self.objects is not None and batch.instances.ids:
                await self.objects.expired(self.database, batch.instances.ids)
            self._swept = self._swept + batch
            if batch.more:
                self._next_sweep = now
            else:
                self._next_sweep = now + self.retention_interval
                if self._swept.total:
                    self.log.info("retention.swept", **self._swept.as_dict())
                self._swept = SweepResult()
        due = min(self._next_check, self._next_sweep)
        if self.objects is not None:
            due = min(due, await self.objects.run_due(self.database, now))
        return max(due - time.monotonic(), 0.0)

    async def check_progress(self) -> bool:
        """One stuck check; True if its batch was full."""
        async with self.database.connection() as conn:
            found = await progress_sql.stuck_repair(conn, limit=_STUCK_BATCH, max_repairs=self.max_repairs)
        for stuck in found:
            log = self.log.bind(instance_id=stuck.instance_id, workflow=stuck.workflow_name)
            if stuck.cause is None:
                log.warning("instance.repaired", found=stuck.missing, repairs=stuck.repairs)
            else:
                log.warning("instance.stuck", cause=stuck.cause, reason=stuck.reason)
        await self.report_locked_leases()
        if time.monotonic() >= self._next_overdue_report:
            await self.report_overdue()
        return len(found) == _STUCK_BATCH

    async def report_locked_leases(self) -> None:
        """One warning per instance whose expired lease a live transaction still holds."""
        async with self.database.connection() as conn:
            locked = await locks_sql.expired_leases_locked(conn, limit=_STUCK_BATCH)
        for held in locked:
            metrics.LEASES_LOCKED.inc()
            self.log.warning(
                "instance.lease_locked",
                instance_id=held.instance_id,
                workflow=held.workflow_name,
                lease_owner=held.lease_owner,
                expired_seconds=round(held.expired_seconds, 1),
                holder_pid=held.holder_pid,
                holder_state=held.holder_state,
                holder_address=held.holder_address,
                hint=f"its row is locked by server backend {held.holder_pid}, so no claim takes it over until that "
                f"transaction ends; kenning why {held.instance_id}",
            )

    async def report_overdue(self) -> None:
        """One warning per workflow with instances due longer than ``overdue_seconds`` and
        not claimed; repeated at most once per that period while they stay so."""
        async with self.database.connection() as conn:
            overdue = await progress_sql.instances_overdue(conn, seconds=self.overdue_seconds, limit=_STUCK_BATCH)
            orphans = await progress_sql.instances_pinned_orphaned(
                conn, seconds=self.overdue_seconds, limit=_STUCK_BATCH
            )
        for late in overdue:
            self.log.warning(
                "instances.overdue",
                workflow=late.workflow_name,
                count=late.count,
                oldest_seconds=round(late.oldest_seconds, 1),
                hint=f"due but not claimed; kenning why {late.oldest_id}",
            )
        for orphan in orphans:
            live = ", ".join(orphan.live_versions) or "none"
            self.log.warning(
                "instances.version_gone",
                workflow=orphan.workflow_name,
                version=orphan.version,
                count=orphan.count,
                live_versions=orphan.live_versions,
                hint=f"pinned to code version {orphan.version}, which no live worker runs (live workers run {live}): "
                f"start a worker of that version; kenning why {orphan.oldest_id}",
            )
        reported = overdue or orphans
        self._next_overdue_report = time.monotonic() + (self.overdue_seconds if reported else 0.0)
