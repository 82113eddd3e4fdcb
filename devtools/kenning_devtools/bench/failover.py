"""Failover: a primary and its synchronous standby under pg_auto_failover
(``kenning_devtools.autofailover``), two workers on libpq's multi-host URL and a steady
stream of workflow starts. The primary's machine is lost (its pg_autoctl and PostgreSQL
killed with SIGKILL) and the monitor promotes the standby. Measured:

- kill → promotion: the manager's part (its health checks tightened to a second here);
- promotion → the first step recorded on the new primary: Kenning's part, its processes
  reconnecting by themselves (the README's bound: the poll interval, at most 1 s);
- promotion → every workflow started before the kill completed: those in flight at the
  kill could not release their leases, so they wait for them to expire (the lease).

Nothing is restarted; every start the client saw succeed must complete (``lost``: 0)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg

from kenning.client import Client
from kenning.db import connect
from kenning.db.migrate import migrate
from kenning.errors import DatabaseUnavailableError
from kenning_devtools import autofailover
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.workflows import bench_three
from kenning_devtools.ports import free_port

APP = "kenning_devtools.bench.workflows"
POLL_SECONDS = 1.0  # the workers' default --poll-interval, passed so the report states it
LEASE_SECONDS = 5.0
STARTS_PER_SECOND = 20
OBSERVE_SECONDS = 0.02  # how often the new primary is read: the measure's resolution

_STEPS = "SELECT count(*) FROM kenning_history"
_UNFINISHED = "SELECT count(*) FROM kenning_instances WHERE id = ANY(%s) AND status <> 'completed'"


class _Starts:
    """Workflow starts at a steady rate, through the multi-host URL; the ids that started."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.started: list[str] = []
        self.refused = 0
        self._running = True

    async def run(self) -> None:
        n = 0
        while self._running:
            n += 1
            try:
                async with asyncio.timeout(5):
                    self.started.append((await self.client.start(bench_three, value=n)).instance_id)
            except (DatabaseUnavailableError, psycopg.Error, TimeoutError):
                self.refused += 1  # no primary answers: a caller retries
            await asyncio.sleep(1 / STARTS_PER_SECOND)

    def stop(self) -> None:
        self._running = False


async def _until(url: str, query: str, params: tuple[Any, ...], done: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(query, params)).fetchone()
            if row is not None and done(row[0]):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"failover: {what} not seen within {timeout:.0f} s")
            await asyncio.sleep(OBSERVE_SECONDS)


def summary(
    *, kill_to_promotion: float, to_first_step: float, to_in_flight_done: float, **counts: int
) -> dict[str, Any]:
    """The section's report from its measures (seconds)."""
    return {
        "poll_seconds": POLL_SECONDS,
        "lease_seconds": LEASE_SECONDS,
        "kill_to_promotion_seconds": round(kill_to_promotion, 2),
        "promotion_to_first_step_seconds": round(to_first_step, 2),
        "promotion_to_in_flight_done_seconds": round(to_in_flight_done, 2),
        "first_step_within_poll": to_first_step <= POLL_SECONDS,
        "in_flight_within_lease_and_poll": to_in_flight_done <= LEASE_SECONDS + POLL_SECONDS,
        **counts,
    }


async def run_failover(ports: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """``ports``: the monitor's and the two nodes' (default: free ones, picked at random)."""
    reason = autofailover.missing()
    if reason is not None:
        return {"skipped": reason}
    monitor, first, second = ports or (free_port(), free_port(), free_port())
    with autofailover.formation(monitor, (first, second)) as ha:
        url = ha.multi_host_url
        await asyncio.to_thread(migrate, url)
        worker = ["worker", "--app", APP, "--no-migrate", "--poll-interval", str(POLL_SECONDS)]
        worker += ["--lease-seconds", str(LEASE_SECONDS)]
        database = connect(url)
        with fleet(url) as processes:
            processes.spawn_all([(worker, "worker.started")] * 2)
            async with Client(database=database) as client:
                starts = _Starts(client)
                stream = asyncio.create_task(starts.run())
                try:
                    while len(starts.started) < 2 * STARTS_PER_SECOND:  # two seconds of steady work
                        await asyncio.sleep(0.1)
                    old = ha.primary()
                    in_flight = list(starts.started)
                    killed = time.monotonic()
                    await asyncio.to_thread(ha.kill, old)
                    new = await asyncio.to_thread(ha.wait_promoted, old)
                    promoted = time.monotonic()
                    primary = new.url(ha.database)
                    async with await psycopg.AsyncConnection.connect(primary, autocommit=True) as conn:
                        row = await (await conn.execute(_STEPS)).fetchone()
                    baseline = int(row[0]) if row is not None else 0
                    await _until(primary, _STEPS, (), lambda n: n > baseline, "a step on the new primary", 60)
                    first_step = time.monotonic()
                    await _until(primary, _UNFINISHED, (in_flight,), lambda n: n == 0, "the in-flight ones done", 120)
                    in_flight_done = time.monotonic()
                    deadline = time.monotonic() + 30  # a second's worth of new starts, on the new primary
                    while len(starts.started) < len(in_flight) + STARTS_PER_SECOND and time.monotonic() < deadline:
                        await asyncio.sleep(0.1)
                finally:
                    starts.stop()
                    await stream
            with contextlib.suppress(TimeoutError):
                await _until(primary, _UNFINISHED, (starts.started,), lambda n: n == 0, "every start done", 60)
            async with await psycopg.AsyncConnection.connect(primary, autocommit=True) as conn:
                row = await (await conn.execute(_UNFINISHED, (starts.started,))).fetchone()
        await database.dispose()
    return summary(
        kill_to_promotion=promoted - killed,
        to_first_step=first_step - promoted,
        to_in_flight_done=in_flight_done - promoted,
        started=len(starts.started),
        refused_while_no_primary=starts.refused,
        started_before_kill=len(in_flight),
        lost=int(row[0]) if row is not None else len(starts.started),
    )
