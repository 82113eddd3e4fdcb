"""SQL for bulk operator actions: which instances a filter selects, counted (``--dry-run``)
and read in keyset pages by id, so the action runs in small batches, each its own short
transaction, and no statement locks more than one batch's rows.

A filter names statuses (the action's own eligible ones: what it would refuse is never
selected), optionally one workflow and a creation window; ``as_of`` bounds the window to
the moment the action began, so instances started meanwhile are not swept in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from kenning.db import Executor, statement
from kenning.storage.escapes import TERMINATED


@dataclass(frozen=True)
class BulkFilter:
    statuses: tuple[str, ...]
    workflow: str | None = None
    created_before: datetime | None = None
    created_after: datetime | None = None
    not_cancel_requested: bool = False  # cancel: one already asked to cancel is not asked again
    not_terminated: bool = False  # retry: a terminated instance stays ended

    def shown(self) -> dict[str, Any]:
        """As the operator action log records it: the fields given."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v not in (None, False)}


_WHERE = f"""
    status = ANY(CAST(:statuses AS text[]))
    AND (CAST(:workflow AS text) IS NULL OR workflow_name = :workflow)
    AND (CAST(:before AS timestamptz) IS NULL OR created_at < :before)
    AND (CAST(:after AS timestamptz) IS NULL OR created_at >= :after)
    AND created_at <= CAST(:as_of AS timestamptz)
    AND NOT (CAST(:not_cancel_requested AS boolean) AND cancel_requested)
    AND NOT (CAST(:not_terminated AS boolean) AND coalesce(error ->> 'reason' = '{TERMINATED}', false))
"""


def _params(selected: BulkFilter, as_of: datetime) -> dict[str, Any]:
    return {
        "statuses": list(selected.statuses),
        "workflow": selected.workflow,
        "before": selected.created_before,
        "after": selected.created_after,
        "as_of": as_of,
        "not_cancel_requested": selected.not_cancel_requested,
        "not_terminated": selected.not_terminated,
    }


_BULK_NOW = statement("SELECT now() AS now")


async def bulk_now(conn: Executor) -> datetime:
    """The database's clock: a bulk action's ``as_of``."""
    row = (await conn.execute(_BULK_NOW)).first()
    assert row is not None
    return row.now  # type: ignore[no-any-return]


_BULK_COUNT = statement(f"SELECT count(*) AS matching FROM kenning_instances WHERE {_WHERE}")


async def bulk_count(conn: Executor, selected: BulkFilter, as_of: datetime) -> int:
    """How many instances the filter selects now."""
    row = (await conn.execute(_BULK_COUNT, _params(selected, as_of))).first()
    return 0 if row is None else int(row.matching)


_BULK_PAGE = statement(
    f"""
    SELECT id FROM kenning_instances
    WHERE {_WHERE} AND (CAST(:after_id AS text) IS NULL OR id > :after_id)
    ORDER BY id
    LIMIT :limit
    """
)


async def bulk_page(
    conn: Executor, selected: BulkFilter, as_of: datetime, *, after_id: str | None, limit: int
) -> list[str]:
    """The next ``limit`` ids the filter selects after ``after_id`` (in id order)."""
    params = {**_params(selected, as_of), "after_id": after_id, "limit": limit}
    return [str(row.id) for row in await conn.execute(_BULK_PAGE, params)]
