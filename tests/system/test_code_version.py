"""A worker's code version set by hand (``--code-version`` / ``KENNING_CODE_VERSION``, a
build or release id), and what a version covers: the whole worker, every workflow it runs
(docs/operations.md#version-pinning). Through real worker processes of
``tests.apps.pinning_v1``, ``tests.apps.pinning_v2`` and ``tests.apps.pinning_v1b`` (v1
with only ``auto_order`` changed)."""

from __future__ import annotations

import json
import signal
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests.console_support import console_ready, spawn_console
from tests.scheduler_support import log_events
from tests.support import (
    ProcessPool,
    check_invariants,
    eventually,
    executions,
    kenning_command,
    run_kenning,
    workers_started,
)

V1, V1B, V2 = "tests.apps.pinning_v1", "tests.apps.pinning_v1b", "tests.apps.pinning_v2"
Sql = psycopg.Connection[tuple[Any, ...]]


def _rows(sql: Sql, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return list(sql.execute(query, params).fetchall())


def _status(sql: Sql, ids: list[str]) -> dict[str, str]:
    return {str(i): str(s) for i, s in _rows(sql, "SELECT id, status FROM kenning_instances WHERE id = ANY(%s)", ids)}


def _pins(sql: Sql, ids: list[str]) -> dict[str, Any]:
    return {
        str(i): p for i, p in _rows(sql, "SELECT id, pinned_version FROM kenning_instances WHERE id = ANY(%s)", ids)
    }


def _started(processes: ProcessPool, worker: psutil.Popen) -> dict[str, Any]:
    (started,) = log_events(processes.log_of(worker), "worker.started")
    return started


async def _start_waiting(client: Client, sql: Sql, count: int) -> list[str]:
    """``count`` new ``pinned_order`` instances, once each waits for its message ``go``."""
    ids = [(await client.start("pinned_order")).instance_id for _ in range(count)]
    await eventually(lambda: set(_status(sql, ids).values()) == {"waiting_for_message"}, message="waiting")
    return ids


async def _stop(worker: psutil.Popen) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


async def test_workers_of_two_explicit_versions_each_keep_their_pinned_instances(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    console_url, console = spawn_console(processes, database_url)
    # the flag for one release, the variable for the other
    old = processes.worker(database_url, V1, "--code-version", "2026.12.1", env=env)
    await workers_started(processes, [old])
    started = _started(processes, old)
    assert started["code_version"] == "2026.12.1"
    fingerprint = started["code_fingerprint"]  # still logged beside it: the code's own
    assert len(fingerprint) == 12 and fingerprint != "2026.12.1"

    async with Client(database=database) as client:
        first = await _start_waiting(client, sql, 3)
        assert _pins(sql, first) == dict.fromkeys(first, "2026.12.1")

        # the deploy: 2026.12.2 replaces 2026.12.1 and pins what it starts
        await _stop(old)
        new = processes.worker(database_url, V2, env={**env, "KENNING_CODE_VERSION": "2026.12.2"})
        await workers_started(processes, [new])
        assert _started(processes, new)["code_version"] == "2026.12.2"
        second = await _start_waiting(client, sql, 3)
        assert _pins(sql, second) == dict.fromkeys(second, "2026.12.2")
        for instance_id in first:
            await client.send_message(instance_id, "go")

        # the operator's views name the versions set, not fingerprints
        workers = kenning_command("workers", "list", "--live", url=database_url)
        assert workers.returncode == 0, workers.stderr
        assert "(2026.12.2)" in workers.stdout and "2026.12.1" not in workers.stdout
        listed = json.loads(kenning_command("workers", "list", "--live", "--json", url=database_url).stdout)
        (details,) = [entry["details"] for entry in listed if entry["kind"] == "worker"]
        assert details["code_version"] == "2026.12.2" and details["code_fingerprint"] != fingerprint
        await console_ready(console_url, console)
        async with httpx.AsyncClient(base_url=console_url, timeout=10) as browser:
            page = (await browser.get("/workers")).text
        assert "code 2026.12.2</span>" in page
        why = kenning_command("why", first[0], url=database_url)
        assert why.returncode == 0, why.stderr
        assert "it waits for a worker running version 2026.12.1 (it is pinned); live workers run 2026.12.2 (1)" in (
            why.stdout
        )
        assert "pinned to code version 2026.12.1; live workers run 2026.12.2 (1)" in why.stdout
        # 2026.12.2 runs, has their message, and leaves them: they are not its instances
        await eventually(lambda: set(_status(sql, first).values()) == {"pending"}, message="woken, unclaimed")
        assert not any(line.startswith("v2") and line.split()[-1] in first for line in executions(side_channel))

        # 2026.12.1 back beside 2026.12.2: each finishes its own, on its own code
        again = processes.worker(database_url, V1, "--code-version", "2026.12.1", env=env)
        await workers_started(processes, [again])
        for instance_id in second:
            await client.send_message(instance_id, "go")
        for instance_id in first:
            assert await client.result(instance_id, timeout=60) == "v1 second"
        for instance_id in second:
            assert await client.result(instance_id, timeout=60) == "v2 second"
        lines = executions(side_channel)
        for label, ids in (("v1", first), ("v2", second)):
            other = "v2" if label == "v1" else "v1"
            for instance_id in ids:
                assert lines[f"{label} first {instance_id}"] == lines[f"{label} second {instance_id}"] == 1
                assert lines[f"{other} first {instance_id}"] == lines[f"{other} second {instance_id}"] == 0
    check_invariants(sql)


async def test_a_change_to_another_workflow_is_a_new_version_for_every_workflow_of_the_worker(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    """Only ``auto_order`` differs between v1 and v1b; ``pinned_order``'s source is the
    same. Its pinned instances still wait for a worker of v1's version: one version per
    worker, as Temporal's deployments and DBOS's application versions."""
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    old = processes.worker(database_url, V1, env=env)
    await workers_started(processes, [old])
    v1 = _started(processes, old)["code_version"]
    async with Client(database=database) as client:
        pinned = await _start_waiting(client, sql, 3)
        assert _pins(sql, pinned) == dict.fromkeys(pinned, v1)
        await _stop(old)

        other = processes.worker(database_url, V1B, env=env)
        await workers_started(processes, [other])
        v1b = _started(processes, other)["code_version"]
        assert v1b != v1
        for instance_id in pinned:
            await client.send_message(instance_id, "go")
        auto = (await client.start("auto_order")).instance_id  # the changed workflow runs there
        await eventually(lambda: executions(side_channel)[f"v1b first {auto}"] == 1, message="auto_order on v1b")
        await eventually(lambda: set(_status(sql, pinned).values()) == {"pending"}, message="woken, unclaimed")
        why = kenning_command("why", pinned[0], url=database_url)
        assert f"it waits for a worker running version {v1} (it is pinned); live workers run {v1b} (1)" in why.stdout
        assert all(executions(side_channel)[f"v1 second {i}"] == 0 for i in pinned)

        # the old release back: they finish there
        back = processes.worker(database_url, V1, env=env)
        await workers_started(processes, [back])
        for instance_id in pinned:
            assert await client.result(instance_id, timeout=60) == "v1 second"
        await client.send_message(auto, "go")
        assert await client.result(auto, timeout=60) in ("v1 second", "v1b second")  # auto_upgrade: either
    check_invariants(sql)


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "must not be empty"),
        ("2026.12 rc1", "must be printable characters without spaces"),
        ("2026.12.1\x1b[2J", "must be printable characters without spaces"),
        ("x" * 129, "must be at most 128 characters, got 129"),
    ],
)
@pytest.mark.parametrize("by", ["flag", "variable"])
def test_a_bad_code_version_is_one_line_and_exit_code_2(by: str, given: str, problem: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "KENNING_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}
    args = ["worker", "--app", V1, "--no-migrate"]
    if by == "flag":
        args += ["--code-version", given]
    else:
        env["KENNING_CODE_VERSION"] = given
    done = run_kenning(args, env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stdout, done.stderr)
    assert lines[0].startswith("kenning worker: --code-version / KENNING_CODE_VERSION ")
    assert lines[0].endswith(problem) or f"{problem} (" in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
