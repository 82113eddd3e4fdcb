"""Version pinning (issue 37, item 3) through real processes: two workers running two
versions of an app's code (``tests.apps.pinning_v1``, ``tests.apps.pinning_v2``). A
``pinned`` instance runs only on a worker of the version it started on, so a deploy never
replays it on new code; an ``auto_upgrade`` one moves to whichever worker is there.
While its version has no live worker a pinned instance waits, and ``kenning why``, the
stuck check's ``instances.version_gone`` and the gauge
``kenning_pinned_instances_without_worker`` say so."""

from __future__ import annotations

import json
import signal
from typing import Any

import httpx
import psycopg

from kenning import Client
from kenning.db import Database
from tests.console_support import console_ready, spawn_console
from tests.metrics_support import scrape_until, value
from tests.scheduler_support import log_events, spawn_scheduler
from tests.support import (
    ProcessPool,
    check_invariants,
    eventually,
    executions,
    free_port,
    kenning_command,
    workers_started,
)

V1, V2 = "tests.apps.pinning_v1", "tests.apps.pinning_v2"
Sql = psycopg.Connection[tuple[Any, ...]]


def _rows(sql: Sql, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return list(sql.execute(query, params).fetchall())


async def _code_version(sql: Sql, worker_pid: int) -> str:
    """The code version a worker registered (``kenning workers list``), once it has."""
    query = "SELECT details ->> 'code_version' FROM kenning_processes WHERE pid = %s"
    await eventually(lambda: bool(_rows(sql, query, worker_pid)), message="worker registered")
    return str(_rows(sql, query, worker_pid)[0][0])


def _status(sql: Sql, ids: list[str]) -> dict[str, str]:
    return {str(i): str(s) for i, s in _rows(sql, "SELECT id, status FROM kenning_instances WHERE id = ANY(%s)", ids)}


def _pins(sql: Sql, ids: list[str]) -> dict[str, Any]:
    return {
        str(i): p for i, p in _rows(sql, "SELECT id, pinned_version FROM kenning_instances WHERE id = ANY(%s)", ids)
    }


async def test_pinned_instances_run_only_on_their_version_and_wait_for_it(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    metrics_port = free_port()
    scheduler = spawn_scheduler(
        processes,
        database_url,
        "--stuck-check-interval",
        "0.2",
        "--overdue-seconds",
        "1",
        "--metrics-port",
        str(metrics_port),
    )
    console_url, console = spawn_console(processes, database_url)
    old = processes.worker(database_url, V1, env=env)
    await workers_started(processes, [old])
    v1 = await _code_version(sql, old.pid)

    def done(ids: list[str], label: str) -> bool:
        lines = executions(side_channel)
        return all(lines[f"{label} {i}"] == 1 for i in ids)

    async with Client(database=database) as client:
        # only version 1 runs: every instance takes its first step there, then waits
        pinned = [(await client.start("pinned_order")).instance_id for _ in range(4)]
        auto = [(await client.start("auto_order")).instance_id for _ in range(4)]
        parent = (await client.start("pinned_parent")).instance_id
        await eventually(lambda: done(pinned + auto, "v1 first"), timeout=60, message="first steps on v1")
        await eventually(
            lambda: set(_status(sql, pinned + auto).values()) == {"waiting_for_message"}, message="all waiting"
        )
        assert await client.result(parent, timeout=60) == "v1 parent of v1 child"
        # the first claim pinned them to version 1; an auto_upgrade instance is pinned to nothing
        assert _pins(sql, pinned) == dict.fromkeys(pinned, v1)
        assert _pins(sql, auto) == dict.fromkeys(auto, None)
        # a pinned child of a pinned parent starts on its parent's version
        (child_pin,) = _rows(sql, "SELECT pinned_version FROM kenning_instances WHERE parent_id = %s", parent)
        assert child_pin == (v1,)

        # the deploy: version 1 stops, version 2 takes over, and every instance is woken
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=30) == 0
        new = processes.worker(database_url, V2, env=env)
        await workers_started(processes, [new])
        v2 = await _code_version(sql, new.pid)
        assert v2 != v1
        for instance_id in pinned + auto:
            await client.send_message(instance_id, "go")
        # the auto_upgrade ones go on on version 2; the pinned ones are never replayed there
        await eventually(lambda: done(auto, "v2 second"), timeout=60, message="auto_upgrade on v2")
        for instance_id in auto:
            assert await client.result(instance_id, timeout=30) == "v2 second"
        assert set(_status(sql, pinned).values()) == {"pending"}
        assert not any(line.startswith("v2") and line.split()[-1] in pinned for line in executions(side_channel))

        # kenning why says what it waits for
        why = kenning_command("why", pinned[0], url=database_url)
        assert why.returncode == 0, why.stderr
        assert f"it waits for a worker running version {v1} (it is pinned); live workers run {v2} (1)" in why.stdout
        assert f"pinned to code version {v1}; live workers run {v2} (1)" in why.stdout
        explained = json.loads(kenning_command("why", pinned[0], "--json", url=database_url).stdout)
        assert (explained["pinned_version"], explained["live_versions"]) == (v1, {v2: 1})
        show = kenning_command("instances", "show", pinned[0], url=database_url)
        assert "pinned to" in show.stdout and v1 in show.stdout
        await console_ready(console_url, console)
        async with httpx.AsyncClient(base_url=console_url, timeout=10) as browser:
            page = (await browser.get(f"/instances/{pinned[0]}")).text
            assert f'<dd data-pinned>code version <span class="mono">{v1}</span>' in page
            assert "data-pinned" not in (await browser.get(f"/instances/{auto[0]}")).text

        # the stuck check reports them, per workflow and version, and the gauge counts them
        def gone() -> list[dict[str, Any]]:
            return log_events(processes.log_of(scheduler), "instances.version_gone")

        await eventually(lambda: gone(), timeout=30, message="version_gone reported")
        report = gone()[0]
        assert (report["workflow"], report["version"], report["count"], report["level"]) == (
            "pinned_order",
            v1,
            4,
            "warning",
        )
        assert report["live_versions"] == [v2]
        assert report["hint"].endswith(f"start a worker of that version; kenning why {min(pinned)}")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        gauge = "kenning_pinned_instances_without_worker"
        await scrape_until(
            url, lambda f: value(f, gauge, workflow="pinned_order", version=v1) == 4, "pinned instances counted"
        )

        # version 1 comes back: they finish there, where they started
        again = processes.worker(database_url, V1, env=env)
        await workers_started(processes, [again])
        await eventually(lambda: done(pinned, "v1 second"), timeout=60, message="pinned on v1 again")
        for instance_id in pinned:
            assert await client.result(instance_id, timeout=30) == "v1 second"
        await scrape_until(url, lambda f: value(f, gauge, workflow="pinned_order") == 0, "none left waiting")

        # both versions live: new pinned instances stay on the version that first ran them
        both = [(await client.start("pinned_order")).instance_id for _ in range(8)]
        await eventually(lambda: set(_status(sql, both).values()) == {"waiting_for_message"}, message="both waiting")
        pins = _pins(sql, both)
        for instance_id in both:
            await client.send_message(instance_id, "go")
        for instance_id in both:
            label = "v1" if pins[instance_id] == v1 else "v2"
            assert pins[instance_id] in (v1, v2)
            assert await client.result(instance_id, timeout=60) == f"{label} second"
            lines = executions(side_channel)
            assert lines[f"{label} first {instance_id}"] == lines[f"{label} second {instance_id}"] == 1
    check_invariants(sql)
