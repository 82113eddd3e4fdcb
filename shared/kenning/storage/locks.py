"""Expired leases whose instance row is still locked, and the session holding each.

A worker cut off mid-transaction (packets dropped, no reset) leaves its server session
"idle in transaction" with the instance row it wrote locked. Claims skip locked rows
(``FOR UPDATE SKIP LOCKED``), so such an instance is taken over only when that session
ends, however long ago its lease expired. The row's ``xmax`` names the transaction that
locked it; ``pg_locks`` the backend running that transaction, while it runs; then
``pg_stat_activity`` what that backend is doing. Plain reads: nothing here waits on the
lock it reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kenning.db import Executor, statement

_EXPIRED_LEASES_LOCKED = statement(
    """
    SELECT i.id AS instance_id, i.workflow_name, i.lease_owner, i.available_at AS lease_expired_at,
           extract(epoch FROM now() - i.available_at) AS expired_seconds,
           l.pid AS holder_pid, a.state AS holder_state, a.state_change AS holder_since,
           host(a.client_addr) AS holder_address, a.application_name AS holder_application
    FROM kenning_instances AS i
    JOIN pg_locks AS l
      ON l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted AND l.transactionid = i.xmax
    LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE i.status IN ('pending', 'running', 'compensating') AND i.lease_token IS NOT NULL
      AND i.available_at <= now() AND (CAST(:id AS text) IS NULL OR i.id = :id)
    ORDER BY i.available_at
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class LockedLease:
    instance_id: str
    workflow_name: str
    lease_owner: str | None
    lease_expired_at: datetime
    expired_seconds: float
    holder_pid: int
    holder_state: str | None  # "idle in transaction": its client went quiet mid-transaction
    holder_since: datetime | None  # in that state since
    holder_address: str | None
    holder_application: str | None

    def as_json(self) -> dict[str, object]:
        return {
            "pid": self.holder_pid,
            "state": self.holder_state,
            "since": self.holder_since.isoformat() if self.holder_since else None,
            "client_address": self.holder_address,
            "application_name": self.holder_application,
            "lease_expired_at": self.lease_expired_at.isoformat(),
        }


async def expired_leases_locked(conn: Executor, *, limit: int, instance_id: str | None = None) -> list[LockedLease]:
    """Instances whose lease expired and whose row a live transaction still locks (of one
    instance, given ``instance_id``), longest expired first, with the backend holding each."""
    rows = await conn.execute(_EXPIRED_LEASES_LOCKED, {"id": instance_id, "limit": limit})
    return [
        LockedLease(
            instance_id=row.instance_id,
            workflow_name=row.workflow_name,
            lease_owner=row.lease_owner,
            lease_expired_at=row.lease_expired_at,
            expired_seconds=float(row.expired_seconds),
            holder_pid=int(row.holder_pid),
            holder_state=row.holder_state,
            holder_since=row.holder_since,
            holder_address=row.holder_address,
            holder_application=row.holder_application,
        )
        for row in rows
    ]
