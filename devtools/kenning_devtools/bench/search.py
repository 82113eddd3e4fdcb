"""Search attributes at scale (issue 29, item 3; docs/performance.md): a scratch database
beside the given one is filled with N instances (generate_series, in a few statements),
each with two search attributes (``customer``: N/10 distinct values, 10 instances each;
``region``: 5 values, about N/5 instances each, independent of the customer) and a
published status, then the reads a user makes are timed: ``Client.list(where=...)``'s
statement for a selective and an unselective attribute and for both ANDed, the
console's page and next page under a ``where`` filter, ``get_value``'s read, and a
publish's write (rolled back). Each list statement's plan is checked to read
``kenning_search_attributes_lookup``.

    python -m kenning_devtools.bench.search --database-url postgresql://... --instances 1000000

Prints one JSON object. The scratch database is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from kenning.db import Executor, connect
from kenning.storage import console as console_sql
from kenning.storage import instances as instances_sql
from kenning.storage import published as published_sql
from kenning_devtools.bench.scale import _create, _drop
from kenning_devtools.bench.stats import summary_ms

SUFFIX = "search"
REGIONS = 5
PER_CUSTOMER = 10
DAYS = 30  # the instances' created_at spread over the past DAYS days, newest last

_FILL = [
    # the instances: one in ten still waiting, the rest completed
    """
    INSERT INTO kenning_instances (id, workflow_name, status, result, created_at, updated_at, finished_at, run_count)
    SELECT 'search-' || lpad(g::text, 9, '0'), 'bench_search',
           CASE WHEN g %% 10 = 0 THEN 'waiting_for_message' ELSE 'completed' END,
           CASE WHEN g %% 10 = 0 THEN NULL ELSE '{"result": 1}'::jsonb END,
           now() - make_interval(secs => (%(n)s - g) * %(spread)s),
           now() - make_interval(secs => (%(n)s - g) * %(spread)s),
           CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - make_interval(secs => (%(n)s - g) * %(spread)s) END,
           1
    FROM generate_series(1, %(n)s) AS g
    """,
    """
    INSERT INTO kenning_search_attributes (instance_id, key, value, created_at)
    SELECT i.id, a.key,
           CASE a.key WHEN 'customer' THEN 'c-' || (substr(i.id, 8)::int %% %(customers)s)
                      ELSE 'r-' || (abs(hashtext(i.id)) %% %(regions)s) END,
           i.created_at
    FROM kenning_instances AS i CROSS JOIN (VALUES ('customer'), ('region')) AS a(key)
    """,
    """
    INSERT INTO kenning_values (instance_id, key, value)
    SELECT i.id, 'status', jsonb_build_object('text', 'step ' || (substr(i.id, 8)::int %% 7), 'progress', 0.5)
    FROM kenning_instances AS i
    """,
]


def fill(url: str, instances: int) -> dict[str, Any]:
    """Load the scratch database; seconds per statement and the sizes it made."""
    params = {
        "n": instances,
        "spread": DAYS * 86400 / max(instances, 1),
        "customers": max(instances // PER_CUSTOMER, 1),
        "regions": REGIONS,
    }
    took = []
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in _FILL:
            started = time.perf_counter()
            conn.execute(sql, params)  # with parameters, so psycopg reads %% as %
            took.append(round(time.perf_counter() - started, 1))
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE kenning_instances, kenning_search_attributes, kenning_values")
        took.append(round(time.perf_counter() - started, 1))
        sizes = conn.execute(
            """
            SELECT pg_total_relation_size('kenning_instances') AS instances,
                   pg_total_relation_size('kenning_search_attributes') AS search_attributes,
                   pg_relation_size('kenning_search_attributes_lookup') AS lookup_index,
                   pg_total_relation_size('kenning_values') AS values
            """
        ).fetchone()
    assert sizes is not None
    mb = [round(s / 1e6, 1) for s in sizes]
    return {
        "fill_seconds": {"instances": took[0], "search_attributes": took[1], "values": took[2], "vacuum": took[3]},
        "size_mb": {"instances": mb[0], "search_attributes": mb[1], "lookup_index": mb[2], "values": mb[3]},
    }


async def _timed(repeats: int, call: Callable[[int], Awaitable[Any]]) -> tuple[dict[str, float | int], Any]:
    timings, last = [], None
    for n in range(repeats):
        started = time.perf_counter()
        last = await call(n)
        timings.append((time.perf_counter() - started) * 1000)
    return summary_ms(timings), last


def _plan(url: str, sql: str, params: dict[str, Any]) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
        conn.rollback()
    return "\n".join(str(r[0]) for r in rows)


async def measure(url: str, instances: int, repeats: int, seed: int = 29) -> dict[str, Any]:
    """Time the reads and a publish on the loaded database."""
    rng = random.Random(seed)
    customers = max(instances // PER_CUSTOMER, 1)

    def customer() -> str:
        return f"c-{rng.randrange(customers)}"

    def instance_id() -> str:
        return f"search-{rng.randrange(1, instances + 1):09d}"

    database = connect(url, pool_size=1, max_overflow=0)
    results: dict[str, Any] = {}
    try:
        async with database.connection() as conn:

            async def listed(where: Callable[[], dict[str, str]], limit: int = 50) -> list[Any]:
                return await published_sql.instance_list_where(conn, where(), limit=limit)

            cases: dict[str, Callable[[int], Awaitable[Any]]] = {
                "list_where_customer": lambda _: listed(lambda: {"customer": customer()}),
                "list_where_region": lambda _: listed(lambda: {"region": f"r-{rng.randrange(REGIONS)}"}),
                "list_where_customer_and_region": lambda _: listed(
                    lambda: {"customer": customer(), "region": f"r-{rng.randrange(REGIONS)}"}
                ),
                "list_unfiltered": lambda _: instances_sql.instance_list(conn, limit=50),
                "get_value": lambda _: published_sql.value_get(conn, instance_id(), "status"),
            }
            for name, call in cases.items():
                summary, last = await _timed(repeats, call)
                results[name] = {**summary, "rows": len(last) if isinstance(last, list) else int(last is not None)}
            results["console_where_region"] = await _console_pages(conn, repeats, rng)
        results["publish"] = await _publish(database, repeats, instance_id)
    finally:
        await database.dispose()
    results["plans_use_lookup_index"] = _plans(url, customers)
    return results


async def _console_pages(conn: Executor, repeats: int, rng: random.Random) -> dict[str, Any]:
    """The console's first page under ``where=region=r-N`` and the page after it."""
    first_ms, next_ms = [], []
    for _ in range(repeats):
        filters = console_sql.InstanceFilters(where=json.dumps({"region": f"r-{rng.randrange(REGIONS)}"}))
        started = time.perf_counter()
        page = await console_sql.instances_page(conn, filters, after=None, limit=50, scan_limit=10_000)
        first_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await console_sql.instances_page(conn, filters, after=page.next, limit=50, scan_limit=10_000)
        next_ms.append((time.perf_counter() - started) * 1000)
    return {"first_page": summary_ms(first_ms), "next_page": summary_ms(next_ms)}


async def _publish(database: Any, repeats: int, instance_id: Callable[[], str]) -> dict[str, float | int]:
    """``value_publish`` of a searchable key (value and search row), each rolled back."""
    timings = []
    for _ in range(repeats):
        try:
            async with database.transaction() as conn:
                started = time.perf_counter()
                await published_sql.value_publish(
                    conn, instance_id=instance_id(), key="region", value="r-9", searchable=True, search_value="r-9"
                )
                timings.append((time.perf_counter() - started) * 1000)
                raise _RolledBackError
        except _RolledBackError:
            pass
    return summary_ms(timings)


class _RolledBackError(Exception):
    """Leaves a measured write's transaction by its rollback."""


def _plans(url: str, customers: int) -> dict[str, bool]:
    statement = str(published_sql._INSTANCE_LIST_WHERE)
    common = {"status": None, "workflow": None, "limit": 50, "others": "{}"}
    return {
        name: "kenning_search_attributes_lookup" in _plan(url, statement, {**common, **params})
        for name, params in {
            "customer": {"key": "customer", "value": f"c-{customers // 2}"},
            "region": {"key": "region", "value": "r-1"},
            "customer_and_region": {
                "key": "customer",
                "value": f"c-{customers // 2}",
                "others": json.dumps({"region": "r-1"}),
            },
        }.items()
    }


def run(database_url: str, instances: int, repeats: int, keep: bool = False) -> dict[str, Any]:
    """Fill a scratch database beside ``database_url``, measure, drop it (unless ``keep``)."""
    url = _create(database_url, SUFFIX)
    try:
        report: dict[str, Any] = {"instances": instances, "repeats": repeats, **fill(url, instances)}
        report.update(asyncio.run(measure(url, instances, repeats)))
        return report
    finally:
        if not keep:
            _drop(database_url, SUFFIX)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kenning_devtools.bench.search", description=__doc__)
    parser.add_argument("--database-url", required=True, help="the scratch database is made beside this one")
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--keep", action="store_true", help="leave the scratch database")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.repeats < 1:
        parser.error("--instances and --repeats must be at least 1")
    json.dump(run(args.database_url, args.instances, args.repeats, args.keep), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
