"""Storage that stays flat as the tables grow (issue 15, docs/performance.md "Scale"): new
instance ids sort by creation time, and the hot tables are vacuumed after a fixed count of
dead rows rather than a share of the table."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

from kenning.starting import time_ordered_hex

Sql = psycopg.Connection[tuple[Any, ...]]


def test_new_instance_ids_are_uuid7_hex_that_sort_by_creation_time() -> None:
    earlier = time_ordered_hex()
    time.sleep(0.002)  # the next millisecond: ids within one millisecond sort at random
    later = time_ordered_hex()
    assert len(earlier) == 32 and int(earlier, 16) >= 0
    parsed = uuid.UUID(earlier)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert abs(int(earlier[:12], 16) - time.time_ns() // 1_000_000) < 60_000
    assert earlier < later
    assert len({time_ordered_hex() for _ in range(1000)}) == 1000


def test_the_hot_tables_are_vacuumed_after_a_fixed_count_of_dead_rows(sql: Sql) -> None:
    rows = sql.execute(
        "SELECT relname, reloptions FROM pg_class "
        "WHERE relkind = 'r' AND starts_with(relname, 'kenning_') AND reloptions IS NOT NULL"
    ).fetchall()
    options = {name: dict(option.split("=", 1) for option in reloptions) for name, reloptions in rows}
    churned = ("kenning_instances", "kenning_inbox", "kenning_outbox", "kenning_timers", "kenning_event_subscriptions")
    for table in churned:
        assert options[table]["autovacuum_vacuum_scale_factor"] == "0", table
        assert int(options[table]["autovacuum_vacuum_threshold"]) > 0, table
    assert options["kenning_history"]["autovacuum_vacuum_insert_scale_factor"] == "0"
