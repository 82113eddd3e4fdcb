"""SQL for published values and search attributes (migration 0012, ``kenning/values.py``).

A ``publish_value`` step writes its value (the latest per instance and key wins) and, for
a key its workflow declares in ``search_attributes``, the key's text in
``kenning_search_attributes``, in one statement the worker runs in the step record's
transaction; it notifies ``CHANNEL_RESULTS`` with the instance's id when a client listens,
so a ``Client.get_value(timeout=...)`` waiting on it reads again at once. Values outlive
the instance's end and go with it (``retention``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kenning import codecs
from kenning.core.names import STATUS_VALUE_KEY
from kenning.core.published import search_text
from kenning.core.records import InstanceRow
from kenning.db import Executor, statement
from kenning.storage.names import notify_results
from kenning.storage.rows import instance_row_columns


# Search attributes a start sets (``wf.options(search_attributes=...)``), written with the
# rows as a publish_value of each would write them (value_publish below): the value, and
# its text in the search with the instance's created_at (the lookup index's order).
# ``started`` is a CTE of (id, attributes, search, created_at) of the rows inserted.
def start_attributes(started: str) -> str:
    return f"""attributes_valued AS (
        INSERT INTO kenning_values AS v (instance_id, key, value)
        SELECT a.id, e.key, e.value FROM {started} AS a CROSS JOIN LATERAL jsonb_each(a.attributes) AS e(key, value)
        WHERE a.attributes IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
        RETURNING 1
    ), attributes_indexed AS (
        INSERT INTO kenning_search_attributes AS x (instance_id, key, value, created_at)
        SELECT a.id, e.key, e.value, a.created_at
        FROM {started} AS a CROSS JOIN LATERAL jsonb_each_text(a.search) AS e(key, value)
        WHERE a.search IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE SET value = EXCLUDED.value
        RETURNING 1
    )"""


def search_texts(attributes: dict[str, Any] | None) -> dict[str, str] | None:
    """A start's search attributes as the search indexes them (None values are not)."""
    if not attributes:
        return None
    texts = {key: search_text(key, value) for key, value in attributes.items()}
    return {key: text for key, text in texts.items() if text is not None}


@dataclass(frozen=True)
class PublishedValue:
    key: str
    value: Any  # JSON
    updated_at: datetime


@dataclass(frozen=True)
class ValueRead:
    """``value_get``'s answer: the instance's status, and its value of the key if published."""

    instance_status: str
    value: PublishedValue | None


_VALUE_PUBLISH = statement(
    f"""
    WITH target AS (
        SELECT id, created_at FROM kenning_instances WHERE id = :instance_id
    ), published AS (
        INSERT INTO kenning_values AS v (instance_id, key, value)
        SELECT t.id, :key, CAST(:value AS jsonb) FROM target AS t
        ON CONFLICT (instance_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
        RETURNING v.instance_id AS id
    ), indexed AS (
        INSERT INTO kenning_search_attributes AS s (instance_id, key, value, created_at)
        SELECT t.id, :key, :search_value, t.created_at FROM target AS t
        WHERE :searchable AND CAST(:search_value AS text) IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE SET value = EXCLUDED.value
        RETURNING 1
    ), unindexed AS (
        -- a declared key published as null leaves the search
        DELETE FROM kenning_search_attributes AS s
        WHERE :searchable AND CAST(:search_value AS text) IS NULL
          AND s.instance_id = :instance_id AND s.key = :key
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM published) AS published, {notify_results("published")} AS notified
    """
)


async def value_publish(
    conn: Executor, *, instance_id: str, key: str, value: Any, searchable: bool, search_value: str | None
) -> bool:
    """Write ``value`` (JSON) as the instance's latest of ``key`` and, when ``searchable``,
    its search text (``search_value``; None removes it); in the caller's transaction. False
    when there is no such instance (nothing written)."""
    row = (
        await conn.execute(
            _VALUE_PUBLISH,
            {
                "instance_id": instance_id,
                "key": key,
                "value": json.dumps(value),
                "searchable": searchable,
                "search_value": search_value,
            },
        )
    ).one()
    return bool(row.published)


_VALUE_GET = statement(
    """
    SELECT i.status, v.key, v.value, v.updated_at
    FROM kenning_instances AS i
    LEFT JOIN kenning_values AS v ON v.instance_id = i.id AND v.key = :key
    WHERE i.id = :instance_id
    """
)


async def value_get(conn: Executor, instance_id: str, key: str) -> ValueRead | None:
    """The instance's status and its value of ``key`` (None: not published); None when
    there is no such instance."""
    row = (await conn.execute(_VALUE_GET, {"instance_id": instance_id, "key": key})).first()
    if row is None:
        return None
    value = None if row.key is None else PublishedValue(row.key, codecs.unseal(row.value), row.updated_at)
    return ValueRead(str(row.status), value)


_VALUES_OF = statement(
    """
    SELECT key, value, updated_at FROM kenning_values WHERE instance_id = :instance_id ORDER BY key
    """
)


async def values_of(conn: Executor, instance_id: str) -> list[PublishedValue]:
    """Every value the instance published, by key."""
    rows = await conn.execute(_VALUES_OF, {"instance_id": instance_id})
    return [PublishedValue(row.key, codecs.shown(row.value), row.updated_at) for row in rows]


_SEARCH_ATTRIBUTES_OF = statement(
    """
    SELECT key, value FROM kenning_search_attributes WHERE instance_id = :instance_id ORDER BY key
    """
)


async def search_attributes_of(conn: Executor, instance_id: str) -> dict[str, str]:
    """The instance's search attributes, as their indexed text."""
    rows = await conn.execute(_SEARCH_ATTRIBUTES_OF, {"instance_id": instance_id})
    return {row.key: row.value for row in rows}


def other_pairs_hold(search: str, others: str) -> str:
    """SQL: the instance of the search row ``search`` holds every pair of the JSON object
    parameter ``others``, each read on the primary key (instance_id, key): the lookup index
    would scan the pair's whole (key, value) range for this instance."""
    return f"""NOT EXISTS (
              SELECT FROM jsonb_each_text(CAST(:{others} AS jsonb)) AS w
              WHERE (SELECT o.value FROM kenning_search_attributes AS o
                     WHERE o.instance_id = {search}.instance_id AND o.key = w.key) IS DISTINCT FROM w.value)"""


# Driven by kenning_search_attributes_lookup: the first pair's index entries are read in
# the list's order (newest first), the other pairs are checked per entry on the primary
# key, so a page reads about ``limit`` entries when most match, however many do.
_INSTANCE_LIST_WHERE = statement(
    f"""
    SELECT {instance_row_columns("i")}
    FROM kenning_search_attributes AS s
    JOIN kenning_instances AS i ON i.id = s.instance_id
    WHERE s.key = :key AND s.value = :value
      AND (CAST(:status AS text) IS NULL OR i.status = :status)
      AND (CAST(:workflow AS text) IS NULL OR i.workflow_name = :workflow)
      AND {other_pairs_hold("s", "others")}
    ORDER BY s.created_at DESC, s.instance_id DESC
    LIMIT :limit
    """
)


# A ``where`` of several pairs is driven by its most selective one: each pair's matches are
# counted up to SELECTIVITY_PROBE on the lookup index (an index-only range, bounded).
SELECTIVITY_PROBE = 1000
_SEARCH_SELECTIVITY = statement(
    f"""
    SELECT w.key, w.value
    FROM jsonb_each_text(CAST(:where AS jsonb)) AS w
    CROSS JOIN LATERAL (
        SELECT count(*) AS matches FROM (
            SELECT FROM kenning_search_attributes AS s WHERE s.key = w.key AND s.value = w.value
            LIMIT {SELECTIVITY_PROBE}) AS m
    ) AS c
    ORDER BY c.matches, w.key
    """
)


async def most_selective_first(conn: Executor, where: dict[str, str]) -> dict[str, str]:
    """``where`` with its most selective pair first (one probe; as it is for one pair)."""
    if len(where) < 2:
        return where
    rows = await conn.execute(_SEARCH_SELECTIVITY, {"where": json.dumps(where)})
    return {row.key: row.value for row in rows}


async def instance_list_where(
    conn: Executor,
    where: dict[str, str],
    *,
    status: str | None = None,
    workflow_name: str | None = None,
    limit: int = 50,
) -> list[InstanceRow]:
    """The newest ``limit`` instances whose search attributes hold every pair of ``where``
    (at least one; its most selective pair drives the read); instances created in the
    same transaction by id, descending (the lookup index's order, the console's)."""
    (key, value), *others = (await most_selective_first(conn, where)).items()
    params = {
        "key": key,
        "value": value,
        "others": json.dumps(dict(others)),
        "status": status,
        "workflow": workflow_name,
        "limit": limit,
    }
    return [InstanceRow(**row._asdict()) for row in await conn.execute(_INSTANCE_LIST_WHERE, params)]


@dataclass(frozen=True)
class ShownValue:
    """A published value as the console's instance page shows it: whole when its JSON
    text is at most the bound, else the first characters of it."""

    key: str
    value: Any  # None when only the preview is read
    preview: str | None
    size: int  # bytes of its JSON text
    updated_at: datetime


_VALUES_SHOWN = statement(
    """
    SELECT v.key, v.updated_at, t.size,
           CASE WHEN t.size <= :bound THEN v.value END AS value,
           CASE WHEN t.size > :bound THEN left(t.text, :preview) END AS preview
    FROM kenning_values AS v
    CROSS JOIN LATERAL (
        SELECT CAST(v.value AS text) AS text, octet_length(CAST(v.value AS text)) AS size OFFSET 0
    ) AS t
    WHERE v.instance_id = :instance_id
    ORDER BY v.key
    LIMIT :limit
    """
)


async def values_shown(conn: Executor, instance_id: str, *, limit: int, bound: int, preview: int) -> list[ShownValue]:
    """The instance's first ``limit`` values by key, each bounded (the console's page)."""
    params = {"instance_id": instance_id, "limit": limit, "bound": bound, "preview": preview}
    return [
        # a sealed value is small (its envelope): shown whole, opened when this process has the key
        ShownValue(row.key, codecs.shown(row.value), row.preview, int(row.size), row.updated_at)
        for row in await conn.execute(_VALUES_SHOWN, params)
    ]


_STATUS_TEXTS = statement(
    """
    SELECT instance_id, left(value ->> 'text', 200) AS text, value ->> 'progress' AS progress
    FROM kenning_values
    WHERE instance_id = ANY(CAST(:ids AS text[])) AND key = :key
    """
)


async def status_texts(conn: Executor, instance_ids: list[str]) -> dict[str, str]:
    """What ``set_status`` published last for each of ``instance_ids`` that has one, as a
    line of text (``awaiting payment (40%)``): the console's list column."""
    rows = await conn.execute(_STATUS_TEXTS, {"ids": instance_ids, "key": STATUS_VALUE_KEY})
    texts: dict[str, str] = {}
    for row in rows:
        if row.text is None and row.progress is None:
            continue  # sealed (encrypted): the list shows no status rather than an envelope
        try:
            progress = "" if row.progress is None else f" ({float(row.progress):.0%})"
        except ValueError:
            progress = ""
        texts[row.instance_id] = f"{row.text or ''}{progress}"
    return texts


# One probe per key on kenning_search_attributes_lookup (its leading column).
_SEARCH_KEYS_HELD = statement(
    """
    SELECT k.key
    FROM unnest(CAST(:keys AS text[])) AS k(key)
    WHERE EXISTS (SELECT FROM kenning_search_attributes AS s WHERE s.key = k.key)
    """
)


async def search_keys_held(conn: Executor, keys: Sequence[str]) -> set[str]:
    """Which of ``keys`` any instance holds as a search attribute."""
    rows = await conn.execute(_SEARCH_KEYS_HELD, {"keys": list(keys)})
    return {str(row.key) for row in rows}
