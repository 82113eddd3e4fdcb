"""Ingress throughput: concurrent HTTP clients posting binary CloudEvents (distinct ids)
to a real ``kenning ingress`` for a fixed time; events accepted per second, response
times, and where the CPU went (load client, ingress, PostgreSQL backends)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg

from kenning_devtools.bench.cehttp import binary_event, start_ingress, tree_cpu_seconds
from kenning_devtools.bench.loadclient import Connection
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import summary_ms

EVENT_TYPE = "bench.load"
STATS_FLUSH_SECONDS = 1.2  # backends flush pg_stat_database counters about once a second
Conn = psycopg.AsyncConnection[tuple[Any, ...]]


def backend_cpu_seconds(database: str) -> float:
    """CPU of the live PostgreSQL backends connected to ``database`` (the server may be
    shared with other work; backends that already exited are not counted)."""
    total = 0.0
    for proc in psutil.process_iter(["name", "cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] in ("postgres", "postmaster") and f" {database} " in title:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


async def _scalar(conn: Conn, query: str) -> Any:
    row = await (await conn.execute(query)).fetchone()
    return row[0] if row else None


async def _sessions(conn: Conn) -> int | None:
    """Sessions ever opened on this database (PostgreSQL 14+), else None."""
    try:
        value = await _scalar(conn, "SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    except psycopg.errors.UndefinedColumn:
        return None
    return int(value) if value is not None else None


@dataclass
class _Load:
    """The clients' side: one kept-alive connection each (``loadclient``: httpx costs the
    load generator as much CPU as the ingress it measures, on the same cores)."""

    url: str
    clients: int
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    times_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    async def post(self, http: Connection, client_no: int, n: int, timed: bool) -> None:
        headers, body = binary_event(EVENT_TYPE, {"client": client_no, "n": n}, f"{self.run}-{client_no}-{n}")
        started = time.perf_counter()
        status = await http.post(headers, body)
        if timed:
            self.times_ms.append(1000 * (time.perf_counter() - started))
            self.statuses[status] = self.statuses.get(status, 0) + 1

    async def warm_up(self, https: list[Connection]) -> None:
        """One untimed request per client opens every connection."""
        await asyncio.gather(*(self.post(h, c, 0, False) for c, h in enumerate(https)))

    async def run_for(self, https: list[Connection], seconds: float) -> float:
        deadline = time.monotonic() + seconds

        async def loop(client_no: int, http: Connection) -> None:
            n = 1
            while time.monotonic() < deadline:
                await self.post(http, client_no, n, True)
                n += 1

        started = time.monotonic()
        await asyncio.gather(*(loop(c, h) for c, h in enumerate(https)))
        return time.monotonic() - started


def _capacity(ingress_ms: float | None, postgres_ms: float | None) -> float | None:
    """Events/s the ingress and PostgreSQL could take on all of this machine's CPUs if
    the load client (on the same machine here) used none: an estimate, not a measurement."""
    if not ingress_ms:
        return None
    return round(1000 * (os.cpu_count() or 1) / (ingress_ms + (postgres_ms or 0.0)), 1)


async def run_ingress(url: str, clients: int, seconds: float, ingress_workers: int) -> dict[str, Any]:
    load = _Load(url, clients)
    me = psutil.Process()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as monitor:
        database = str(await _scalar(monitor, "SELECT current_database()"))
        with fleet(url) as running:
            ingress_url, proc = start_ingress(running, ingress_workers)
            https = [await Connection.open(ingress_url) for _ in range(clients)]
            try:
                await load.warm_up(https)
                await asyncio.sleep(STATS_FLUSH_SECONDS)
                sessions_before = await _sessions(monitor)
                own_before, ingress_before = sum(me.cpu_times()[:2]), tree_cpu_seconds(proc)
                pg_before = backend_cpu_seconds(database)
                elapsed = await load.run_for(https, seconds)
                own = sum(me.cpu_times()[:2]) - own_before
                ingress_cpu = tree_cpu_seconds(proc) - ingress_before
                pg_cpu = backend_cpu_seconds(database) - pg_before
            finally:
                await asyncio.gather(*(h.close() for h in https))
            await asyncio.sleep(STATS_FLUSH_SECONDS)
            sessions_after = await _sessions(monitor)
        stored = await _scalar(
            monitor,
            f"SELECT count(*) FROM kenning_inbox WHERE event_type = '{EVENT_TYPE}' AND event_id LIKE '{load.run}-%'",
        )
        # tens of thousands of unhandled events would be a backlog for the workers of
        # the sections that follow, delaying their events behind these
        await monitor.execute(f"DELETE FROM kenning_inbox WHERE event_type = '{EVENT_TYPE}'")
        await monitor.execute("VACUUM ANALYZE kenning_inbox")
    accepted = load.statuses.get(202, 0)
    if stored != accepted + clients:
        raise RuntimeError(f"{accepted} accepted (+{clients} warm-up) but {stored} stored")

    def per_event_ms(cpu: float) -> float | None:
        return round(1000 * cpu / accepted, 3) if accepted else None

    cpu_ms = {
        "ingress": per_event_ms(ingress_cpu),
        "client": per_event_ms(own),
        "postgres_backends": per_event_ms(pg_cpu),
    }

    return {
        "clients": clients,
        "ingress_workers": ingress_workers,
        "seconds": round(elapsed, 3),
        "accepted": accepted,
        "rejected": sum(load.statuses.values()) - accepted,
        "events_per_second": round(accepted / elapsed, 1),
        **{f"response_{k}": v for k, v in summary_ms(load.times_ms).items() if k != "samples"},
        "cpu_ms_per_event": cpu_ms,
        "server_cpu_capacity_per_second": _capacity(cpu_ms["ingress"], cpu_ms["postgres_backends"]),
        # connections opened to the database while the load ran: a pool that churns
        # pays a PostgreSQL backend start per request
        "new_database_sessions": (
            sessions_after - sessions_before if sessions_after is not None and sessions_before is not None else None
        ),
    }
