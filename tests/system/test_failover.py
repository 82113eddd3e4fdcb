"""A database failover under a steady stream of events, with a real HA manager
(pg_auto_failover: a monitor, a primary and its synchronous standby). The primary's
machine is lost (its pg_autoctl and PostgreSQL killed with SIGKILL); the monitor promotes
the standby. Processes reach the primary both ways users do: libpq's multi-host URL
(``target_session_attrs=read-write``) and a movable address (a TCP proxy the test moves to
the new primary when the manager reports it, as a DNS name, a virtual IP or a managed
database's endpoint moves). Nothing is restarted; every event answered 202 starts its
workflow, which completes with each step committed once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from kenning_devtools import autofailover
from tests.ingress_support import Ingress, TcpProxy, binary, cloud_event, new_id, wait_until_serving
from tests.support import (
    ProcessPool,
    check_invariants,
    eventually,
    executions,
    free_port,
    kenning_command,
    workers_started,
)

APP = "tests.apps.failover"
EVENT = "failover.order"

pytestmark = [
    pytest.mark.skipif(autofailover.missing() is not None, reason=str(autofailover.missing())),
    pytest.mark.serial,  # three PostgreSQL servers and a monitor with one-second health checks
]


class Stream:
    """CloudEvents posted at a steady rate, round robin over the ingresses; the ids each
    answered 202 are kept."""

    def __init__(self, ingresses: list[Ingress], per_second: float = 20) -> None:
        self.ingresses = ingresses
        self.interval = 1 / per_second
        self.accepted: list[str] = []
        self.accepted_by: dict[str, int] = {ingress.url: 0 for ingress in ingresses}
        self.refused = 0
        self._running = True

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            n = 0
            while self._running:
                n += 1
                event_id = new_id()
                headers, body = binary(cloud_event(EVENT, {"n": n}, id=event_id))
                ingress = self.ingresses[n % len(self.ingresses)]
                try:
                    answer = await client.post(ingress.url, headers=headers, content=body)
                    if answer.status_code == 202:
                        self.accepted.append(event_id)
                        self.accepted_by[ingress.url] += 1
                    else:
                        self.refused += 1  # 503 while no primary answers: the sender retries
                except httpx.TransportError:
                    self.refused += 1
                await asyncio.sleep(self.interval)

    def stop(self) -> None:
        self._running = False


@contextlib.asynccontextmanager
async def streaming(stream: Stream) -> AsyncIterator[Stream]:
    task = asyncio.create_task(stream.run())
    try:
        yield stream
    finally:
        stream.stop()
        await task


def _spawn_ingress(processes: ProcessPool, url: str) -> Ingress:
    port = free_port()
    process = processes.spawn(
        ["ingress", "--port", str(port), "--no-migrate"], {"KENNING_DATABASE_URL": url}, "ingress"
    )
    return Ingress(url=f"http://127.0.0.1:{port}", process=process)


async def test_a_failover_under_a_stream_of_events_loses_nothing(
    processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    monitor_port, first_port, second_port = free_port(), free_port(), free_port()
    with autofailover.formation(monitor_port, (first_port, second_port), logs_to=tmp_path) as ha:
        old = ha.primary()
        address = TcpProxy(old.url("kenning"))  # the movable address, in front of the primary
        await address.start()
        try:
            ways = {"multi-host": ha.multi_host_url, "movable": address.url}
            migrated = kenning_command("migrate", url=ha.multi_host_url)
            assert migrated.returncode == 0, migrated.stdout + migrated.stderr
            ingresses = [_spawn_ingress(processes, url) for url in ways.values()]
            # heartbeats every half second: each fails during the outage and logs when it resumes
            workers = [
                processes.worker(url, APP, "--lease-seconds", "3", "--presence-interval", "0.5")
                for url in ways.values()
            ]
            for ingress in ingresses:
                wait_until_serving(ingress.url, ingress.process)
            await workers_started(processes, workers)
            started = [(p.pid, p.create_time()) for p in [*workers, *(i.process for i in ingresses)]]

            async with streaming(Stream(ingresses)) as stream:
                await eventually(lambda: len(stream.accepted) >= 30, timeout=30, message="events flow")
                await asyncio.to_thread(ha.kill, old)
                new = await asyncio.to_thread(ha.wait_promoted, old)
                address.target = ("127.0.0.1", new.port)  # the address moves to the new primary
                before = dict(stream.accepted_by)
                # each way reaches the new primary: both ingresses accept again, both workers beat
                await eventually(
                    lambda: all(stream.accepted_by[url] >= before[url] + 15 for url in before),
                    timeout=45,
                    message="both ingresses accept events after the failover",
                )
                await eventually(
                    lambda: all('"process.heartbeat_resumed"' in processes.log_of(w) for w in workers),
                    timeout=30,
                    message="both workers write to the new primary",
                )

            with psycopg.connect(new.url("kenning"), autocommit=True) as sql:

                def unfinished() -> list[tuple[object, ...]]:
                    return sql.execute(
                        "SELECT e.event_id, i.status FROM unnest(%s::text[]) AS e(event_id)"
                        " LEFT JOIN kenning_instances AS i"
                        "  ON i.idempotency_key = 'cloudevent:' || jsonb_build_array('tests', e.event_id)::text"
                        " WHERE i.status IS DISTINCT FROM 'completed'",
                        (stream.accepted,),
                    ).fetchall()

                try:
                    await eventually(
                        lambda: not unfinished(), timeout=60, message="accepted events' workflows complete"
                    )
                except AssertionError as error:
                    logs = "\n".join(processes.log_of(w)[-3000:] for w in workers)
                    raise AssertionError(f"{error}; unfinished {unfinished()[:10]}\n{logs}") from None
                steps = sql.execute(
                    "SELECT count(*) FROM kenning_history AS h JOIN kenning_instances AS i ON i.id = h.instance_id"
                    " WHERE i.idempotency_key IN (SELECT 'cloudevent:' || jsonb_build_array('tests', e)::text"
                    "                             FROM unnest(%s::text[]) AS e)"
                    "   AND h.kind = 'ActivityCompleted'",
                    (stream.accepted,),
                ).fetchone()
                assert steps == (3 * len(stream.accepted),)
                check_invariants(sql, executions=executions(side_channel))
            # no process was restarted, none exited
            for pid, created in started:
                process = psutil.Process(pid)
                assert process.is_running() and process.create_time() == created
                assert process.status() != psutil.STATUS_ZOMBIE
        finally:
            await address.stop()
