"""``app.storage``: the two reads Edda's examples make of Edda's storage, answered from
Kenning's tables in Edda's shapes. Everything else of Edda's storage protocol is Edda's
internals and has no counterpart here."""

from __future__ import annotations

from typing import Any

from kenning.client import Client, default_client
from kenning.errors import WorkflowNotFoundError
from kenning.storage import outbox as outbox_sql


class Storage:
    """Reads through the client ``wf.start()`` uses (the App's ``db_url``, else
    ``KENNING_DATABASE_URL``)."""

    def __init__(self, client: Client | None = None) -> None:
        self._client = client

    @property
    def client(self) -> Client:
        return self._client or default_client()

    async def get_instance(self, instance_id: str) -> dict[str, Any] | None:
        """Edda's instance dict (its keys that Kenning has), or None for an unknown id."""
        try:
            row = await self.client.status(instance_id)
        except WorkflowNotFoundError:
            return None
        return {
            "instance_id": row.id,
            "workflow_name": row.workflow_name,
            "source_hash": row.source_hash,
            "status": row.status,
            "started_at": row.created_at.isoformat(),
            "updated_at": row.updated_at.isoformat(),
            "input_data": row.input,
            "output_data": row.result,
            "error": row.error,
        }

    async def get_pending_outbox_events(self, limit: int = 10) -> list[dict[str, Any]]:
        """The outbox events the relayer has not published yet (pending or being
        published), oldest first, in Edda's shape."""
        async with self.client.database.connection() as conn:
            rows = [
                row
                for status in ("pending", "publishing")
                for row in await outbox_sql.outbox_list(conn, status=status, limit=limit)
            ]
        rows.sort(key=lambda row: row.created_seq)
        return [
            {
                "event_id": row.id,
                "event_type": row.event_type,
                "event_source": row.source,
                "event_data": row.data,
                "content_type": row.content_type,
                "status": row.status,
                "retry_count": row.attempts,
                "last_error": row.last_error,
                "created_at": row.created_at.isoformat(),
            }
            for row in rows[:limit]
        ]
