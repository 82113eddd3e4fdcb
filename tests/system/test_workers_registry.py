"""Who is running: the fleet's registry through real processes (issue 28, part 1).

Two workers (each a ``kenning worker`` process) register with their workflows, and a
scheduler with its schedules; ``kenning workers list --json`` names them all, live. A
worker killed with ``kill -9`` stops heartbeating and shows as stale; ``kenning why`` on
an instance of the workflow only it ran says that no live worker runs it; the scheduler
deletes the stale entry later. A worker stopped with SIGTERM leaves the registry at once.
``kenning_processes_live{kind}`` counts the live ones.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import httpx
import psutil
import psycopg

from kenning.hosting.presence import EXPIRY_INTERVALS, FORGET_AFTER
from tests.support import ProcessPool, eventually, free_port, kenning_command, workers_started

INTERVAL = "0.1"  # --presence-interval: stale 0.3 s after the last heartbeat, deleted 6 s after
FAST = {"KENNING_PRESENCE_INTERVAL": INTERVAL}


def _listed(database_url: str, *args: str) -> list[dict[str, Any]]:
    done = kenning_command("workers", "list", "--json", *args, url=database_url)
    assert done.returncode == 0, done.stderr
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found


def _by_id(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in entries}


async def test_two_workers_are_listed_go_stale_when_killed_and_why_says_so(
    processes: ProcessPool, database_url: str, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    metrics_port = free_port()
    first = processes.worker(database_url, "tests.apps.fleet", "--worker-id", "fleet-a", env=FAST)
    second = processes.worker(
        database_url, "tests.apps.fleet,tests.apps.fleet_orphan", "--worker-id", "fleet-b", env=FAST
    )
    await workers_started(processes, [first, second])
    await eventually(
        lambda: {"fleet-a", "fleet-b"} <= set(_by_id(_listed(database_url, "--kind", "worker"))),
        message="both workers listed",
    )
    listed = _by_id(_listed(database_url))
    a, b = listed["fleet-a"], listed["fleet-b"]
    assert (a["kind"], a["state"], a["pid"]) == ("worker", "live", first.pid)
    assert (b["kind"], b["state"], b["pid"]) == ("worker", "live", second.pid)
    assert a["details"]["workflows"] == ["fleet.double"]
    assert b["details"]["workflows"] == ["fleet.double", "fleet.orphan"]
    assert a["details"]["concurrency"] == 32 and a["details"]["running"] == 0
    assert a["details"]["code_version"] != b["details"]["code_version"]  # different code
    text = kenning_command("workers", "list", url=database_url)
    assert text.returncode == 0, text.stderr
    assert "fleet-a" in text.stdout and "fleet.double,fleet.orphan" in text.stdout, text.stdout

    # a scheduler registers too, and its metrics count the live processes by kind
    def spawn_scheduler(metrics_port: int) -> psutil.Popen:
        return processes.spawn(
            ["scheduler", "--no-migrate", "--metrics-port", str(metrics_port)],
            env={"KENNING_DATABASE_URL": database_url, **FAST},
            name="scheduler",
        )

    def live_workers(metrics_port: int) -> float | None:
        try:
            body = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        for line in body.splitlines():
            if line.startswith('kenning_processes_live{kind="worker"}'):
                return float(line.split()[-1])
        return None

    scheduler = spawn_scheduler(metrics_port)
    await eventually(lambda: live_workers(metrics_port) == 2.0, timeout=30, message="kenning_processes_live 2")
    await eventually(
        lambda: [e["state"] for e in _listed(database_url, "--kind", "scheduler")] == ["live"],
        message="the scheduler listed",
    )
    # Stopped while the killed worker is looked at: a scheduler deletes a stale entry 6 s
    # after its last heartbeat (FORGET_AFTER), and under load the commands below took
    # longer than that, so why found no stale worker. SIGTERM: it leaves the registry.
    scheduler.send_signal(signal.SIGTERM)
    assert scheduler.wait(timeout=20) == 0
    assert _listed(database_url, "--kind", "scheduler") == []

    # kill -9: no goodbye; it goes stale after three missed heartbeats
    second.kill()
    second.wait(timeout=10)
    await eventually(
        lambda: _by_id(_listed(database_url)).get("fleet-b", {}).get("state") == "stale",
        timeout=20,
        message="the killed worker is stale",
    )
    assert [e["id"] for e in _listed(database_url, "--live", "--kind", "worker")] == ["fleet-a"]

    # an instance of the workflow only the dead worker ran: why says nothing will run it
    started = kenning_command("start", "fleet.orphan", "--input", '{"value": 1}', "--json", url=database_url)
    assert started.returncode == 0, started.stderr
    instance_id = json.loads(started.stdout)["instance_id"]
    why = kenning_command("why", instance_id, "--json", url=database_url)
    assert why.returncode == 0, why.stderr
    explained = json.loads(why.stdout)
    assert explained["live_workers"] == 0 and explained["stale_workers"] == 1, explained
    assert "no live worker runs workflow 'fleet.orphan'" in explained["way_forward"], explained["way_forward"]
    plain = kenning_command("why", instance_id, url=database_url)
    assert "no live worker runs 'fleet.orphan', 1 stale" in plain.stdout, plain.stdout
    # ... while one of a workflow a live worker runs is moving on
    done = kenning_command("start", "fleet.double", "--input", '{"value": 4}', "--wait", "20", url=database_url)
    assert done.returncode == 0, done.stderr

    # a scheduler again: the metric counts the one live worker, and the stale entry, silent
    # for FORGET_AFTER times its expiry, is deleted
    metrics_port = free_port()
    scheduler = spawn_scheduler(metrics_port)
    await eventually(lambda: live_workers(metrics_port) == 1.0, timeout=30, message="one live worker in the metric")
    forget = float(INTERVAL) * EXPIRY_INTERVALS * FORGET_AFTER
    await eventually(
        lambda: "fleet-b" not in _by_id(_listed(database_url)), timeout=forget + 20, message="the stale entry deleted"
    )

    # SIGTERM: the worker deregisters as it stops
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0
    assert "fleet-a" not in _by_id(_listed(database_url, "--kind", "worker"))
    scheduler.send_signal(signal.SIGTERM)
    assert scheduler.wait(timeout=20) == 0
    assert _listed(database_url) == []
    assert sql.execute("SELECT count(*) FROM kenning_processes").fetchone() == (0,)


async def test_an_empty_registry_and_a_bad_kind(database_url: str) -> None:
    empty = kenning_command("workers", "list", url=database_url)
    assert (empty.returncode, empty.stdout.strip()) == (0, "no process is registered")
    bad = kenning_command("workers", "list", "--kind", "robot", url=database_url)
    assert bad.returncode == 2
    assert "invalid choice: 'robot'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
