"""SQL for large values: which object-store references rows still hold (the orphan sweep)."""

from __future__ import annotations

from collections.abc import Sequence

from kenning.db import Executor, statement

# Every "$ref" anywhere in the rows that may hold one: the instances' results and the
# history's payloads of the instances asked about and of their parents (a child's end is
# copied into its parent's history with the child's reference).
_REFERENCES = statement(
    """
    WITH asked AS (
        SELECT CAST(unnest(CAST(:ids AS text[])) AS text) AS id
    ), owners AS (
        SELECT id FROM asked
        UNION SELECT i.parent_id FROM kenning_instances AS i JOIN asked AS a ON a.id = i.id
        WHERE i.parent_id IS NOT NULL
    )
    SELECT DISTINCT r.url FROM (
        SELECT jsonb_path_query(h.payload, 'strict $.**."$ref"') #>> '{}' AS url
        FROM kenning_history AS h JOIN owners AS o ON h.instance_id = o.id
        WHERE h.payload IS NOT NULL
        UNION ALL
        SELECT jsonb_path_query(i.result, 'strict $.**."$ref"') #>> '{}' AS url
        FROM kenning_instances AS i JOIN owners AS o ON i.id = o.id
        WHERE i.result IS NOT NULL
    ) AS r
    """
)


async def object_references(conn: Executor, instance_ids: Sequence[str]) -> set[str]:
    """The ``s3://`` addresses the rows of these instances (and of their parents) reference."""
    rows = await conn.execute(_REFERENCES, {"ids": list(instance_ids)})
    return {str(row.url) for row in rows if row.url is not None}
