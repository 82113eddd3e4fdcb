"""SQL for large values: which object-store references rows still hold (the orphan sweep)."""

from __future__ import annotations

from collections.abc import Sequence

from kenning.db import Executor, statement

# Every "$ref" anywhere in the rows that may hold one, of the instances asked about and
# of their parents (a child's end is copied into its parent's history with the child's
# reference): every column a payload is sealed into (kenning.codecs.seal offloads them all).
_REFERENCES = statement(
    """
    WITH asked AS (
        SELECT CAST(unnest(CAST(:ids AS text[])) AS text) AS id
    ), owners AS (
        SELECT id FROM asked
        UNION SELECT i.parent_id FROM kenning_instances AS i JOIN asked AS a ON a.id = i.id
        WHERE i.parent_id IS NOT NULL
    ), payloads AS (
        SELECT h.payload AS v FROM kenning_history AS h JOIN owners AS o ON h.instance_id = o.id
        UNION ALL SELECT i.result FROM kenning_instances AS i JOIN owners AS o ON i.id = o.id
        UNION ALL SELECT i.input FROM kenning_instances AS i JOIN owners AS o ON i.id = o.id
        UNION ALL SELECT i.attempts FROM kenning_instances AS i JOIN owners AS o ON i.id = o.id
        UNION ALL SELECT r.input FROM kenning_instance_runs AS r JOIN owners AS o ON r.instance_id = o.id
        UNION ALL SELECT m.data FROM kenning_messages AS m JOIN owners AS o ON m.instance_id = o.id
        UNION ALL SELECT r.value FROM kenning_replies AS r JOIN owners AS o ON r.instance_id = o.id
        UNION ALL SELECT v.value FROM kenning_values AS v JOIN owners AS o ON v.instance_id = o.id
        UNION ALL SELECT e.value FROM kenning_stream_entries AS e JOIN owners AS o ON e.instance_id = o.id
        UNION ALL SELECT c.args FROM kenning_compensations AS c JOIN owners AS o ON c.instance_id = o.id
        UNION ALL SELECT c.kwargs FROM kenning_compensations AS c JOIN owners AS o ON c.instance_id = o.id
        UNION ALL SELECT x.data FROM kenning_outbox AS x JOIN owners AS o ON x.instance_id = o.id
    )
    SELECT DISTINCT jsonb_path_query(p.v, 'strict $.**."$ref"') #>> '{}' AS url
    FROM payloads AS p WHERE p.v IS NOT NULL
    """
)

# A value no one instance owns (a channel's broadcast, copied into its subscribers'
# mailboxes and from there into their histories; an event's data on its way in or out):
# which of these shared objects any such row still references. Whole
# scans of both tables, narrowed by a text search first; the sweep asks only when the
# store holds shared objects past the grace period.
_SHARED_REFERENCES = statement(
    """
    WITH rows AS (
        SELECT m.data AS v FROM kenning_messages AS m
        WHERE m.data IS NOT NULL AND strpos(CAST(m.data AS text), :marker) > 0
        UNION ALL SELECT h.payload FROM kenning_history AS h
        WHERE h.payload IS NOT NULL AND strpos(CAST(h.payload AS text), :marker) > 0
        UNION ALL SELECT b.data FROM kenning_inbox AS b
        WHERE b.data IS NOT NULL AND strpos(CAST(b.data AS text), :marker) > 0
        UNION ALL SELECT x.data FROM kenning_outbox AS x
        WHERE x.data IS NOT NULL AND strpos(CAST(x.data AS text), :marker) > 0
    )
    SELECT DISTINCT r.url FROM (
        SELECT jsonb_path_query(rows.v, 'strict $.**."$ref"') #>> '{}' AS url FROM rows
    ) AS r WHERE r.url = ANY(CAST(:urls AS text[]))
    """
)


async def object_references(conn: Executor, instance_ids: Sequence[str]) -> set[str]:
    """The ``s3://`` addresses the rows of these instances (and of their parents) reference."""
    rows = await conn.execute(_REFERENCES, {"ids": list(instance_ids)})
    return {str(row.url) for row in rows if row.url is not None}


async def shared_references(conn: Executor, urls: Sequence[str], marker: str) -> set[str]:
    """Which of these shared objects' addresses (all containing ``marker``) a mailbox, a
    history, the inbox or the outbox still references."""
    rows = await conn.execute(_SHARED_REFERENCES, {"urls": list(urls), "marker": marker})
    return {str(row.url) for row in rows if row.url is not None}
