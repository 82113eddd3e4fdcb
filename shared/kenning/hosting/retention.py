"""Retention: what expires and when, and the sweep that deletes it in small batches.

Three kinds of rows expire: finished instances with their history, compensations and
leftover waits (after their workflow's ``@workflow(retention=...)``, else the default;
kenning/storage/retention.py), processed inbox rows (kept for duplicate detection and
``wait_event(since=...)``) and published outbox rows. Every batch is one short statement
on a connection of its own, rows taken with ``FOR UPDATE SKIP LOCKED``: no lock is held
from one batch to the next and no writer waits for the sweep.

The scheduler runs one batch of each kind per pass while some are expired (its timers
fire in between); ``kenning gc`` runs a whole sweep, or with ``--dry-run`` counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kenning.db import Database
from kenning.hosting.config import non_negative_float, positive_float, positive_int, setting
from kenning.storage import inbox as inbox_sql
from kenning.storage import outbox as outbox_sql
from kenning.storage import retention as retention_sql
from kenning.storage.retention import Expired


@dataclass(frozen=True)
class RetentionSettings:
    """Retention's options: ``kenning scheduler``'s (a settings group) and ``kenning gc``'s,
    read from the same variables so that both apply the same policy."""

    instance_retention_days: float = setting(
        0.0,
        type=non_negative_float,
        help="delete finished instances and their history this many days after they end, for workflows "
        "without @workflow(retention=...) (0: keep them)",
    )
    inbox_retention_seconds: float = setting(
        86400.0, type=positive_float, help="keep processed rows this long (duplicate detection, wait_event since=)"
    )
    outbox_retention_hours: float = setting(
        168.0, type=non_negative_float, help="keep published outbox events this long"
    )
    retention_interval: float = setting(60.0, type=positive_float, help="seconds between retention sweeps")
    retention_batch_size: int = setting(
        100, type=positive_int, help="instances (with their history) or inbox/outbox rows deleted per statement"
    )

    def policy(self) -> RetentionPolicy:
        days = self.instance_retention_days
        return RetentionPolicy(
            instance_default_seconds=days * 86400 if days > 0 else None,
            inbox_seconds=self.inbox_retention_seconds,
            outbox_seconds=self.outbox_retention_hours * 3600,
            batch_size=self.retention_batch_size,
        )


@dataclass(frozen=True)
class RetentionPolicy:
    instance_default_seconds: float | None  # for workflows naming no retention; None: kept
    inbox_seconds: float  # processed inbox rows
    outbox_seconds: float  # published outbox rows
    batch_size: int  # rows (instances with their records) per statement


@dataclass(frozen=True)
class SweepResult:
    """Rows deleted (or, in a dry run, that would be)."""

    instances: Expired = field(default_factory=Expired)
    inbox: int = 0
    outbox: int = 0
    more: bool = False  # a batch was full: more may have expired already

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.instances + other.instances, self.inbox + other.inbox, self.outbox + other.outbox, other.more
        )

    @property
    def total(self) -> int:
        i = self.instances
        return i.instances + i.history + i.compensations + i.waits + self.inbox + self.outbox

    def as_dict(self) -> dict[str, int]:
        i = self.instances
        return {
            "instances": i.instances,
            "history": i.history,
            "compensations": i.compensations,
            "waits": i.waits,
            "inbox": self.inbox,
            "outbox": self.outbox,
        }


async def sweep_batch(database: Database, policy: RetentionPolicy) -> SweepResult:
    """One batch of each kind: three short statements, each on its own connection."""
    async with database.connection() as conn:
        instances = await retention_sql.instances_expire(
            conn, default_seconds=policy.instance_default_seconds, limit=policy.batch_size
        )
    async with database.connection() as conn:
        inbox = await inbox_sql.inbox_delete_processed(
            conn, retention_seconds=policy.inbox_seconds, limit=policy.batch_size
        )
    async with database.connection() as conn:
        outbox = await outbox_sql.outbox_delete_published(
            conn, retention_seconds=policy.outbox_seconds, limit=policy.batch_size
        )
    more = policy.batch_size in (instances.instances, inbox, outbox)
    return SweepResult(instances, inbox, outbox, more)


async def sweep(
    database: Database, policy: RetentionPolicy, *, stopping: Callable[[], bool] | None = None
) -> SweepResult:
    """Batches until none is full (or ``stopping()``): everything expired now is gone."""
    total = SweepResult()
    while True:
        total = total + await sweep_batch(database, policy)
        if not total.more or (stopping is not None and stopping()):
            return total


async def count_expired(database: Database, policy: RetentionPolicy) -> SweepResult:
    """What a sweep would delete now (``kenning gc --dry-run``): counts, nothing deleted."""
    async with database.connection() as conn:
        instances = await retention_sql.instances_expired_count(conn, default_seconds=policy.instance_default_seconds)
        inbox = await retention_sql.inbox_processed_expired_count(conn, retention_seconds=policy.inbox_seconds)
        outbox = await retention_sql.outbox_published_expired_count(conn, retention_seconds=policy.outbox_seconds)
    return SweepResult(instances, inbox, outbox)
