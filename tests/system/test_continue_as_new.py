"""Continue-as-new through PostgreSQL and real worker processes (issue 29, item 1): a
chain of runs of one instance, each with a fresh history; a message sent while no worker
runs between two runs is kept for the next; a worker killed mid-chain leaves the chain to
a second worker with every message taken once and none lost.

Before the feature ``continue_as_new`` did not exist (the app failed to import in the
worker, and a loop's history grew with every message).
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import psycopg

from kenning import Client
from kenning.db import Database
from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool, check_invariants, eventually, executions
from tests.support import kenning_command as kenning

APP = "tests.apps.messages"
Sql = psycopg.Connection[tuple[object, ...]]


def run_and_status(sql: Sql, instance_id: str) -> tuple[object, ...] | None:
    return sql.execute("SELECT run, status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()


def chain_of(sql: Sql, instance_id: str) -> list[tuple[object, ...]]:
    return sql.execute(
        "SELECT run, steps, ended, input -> 'received' FROM kenning_instance_runs WHERE instance_id = %s ORDER BY run",
        (instance_id,),
    ).fetchall()


async def test_a_chain_of_runs_keeps_a_message_sent_while_no_worker_runs(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    first = processes.worker(database_url, APP, env=env)
    async with Client(database=database) as client:
        started = await client.start("collect_chain", per_run=3, runs=4, received=[])
        instance = started.instance_id
        for n in range(3):
            await client.send_message(instance, "items", n)
        # run 1 took its three and continued; run 2 waits for its first message
        await eventually(
            lambda: run_and_status(sql, instance) == (2, "waiting_for_message"), timeout=30, message="run 2 waits"
        )
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
        for n in range(3, 12):  # no worker: they wait in the mailbox for run 2 and the runs after it
            await client.send_message(instance, "items", n)
        processes.worker(database_url, APP, env=env)
        assert await client.result(instance, timeout=30) == list(range(12))
        status = await client.status(instance)
    assert status.run == 4
    counts = executions(side_channel)
    assert {n: counts[f"msg {instance} {n}"] for n in range(12)} == dict.fromkeys(range(12), 1)
    # runs 1-3 kept as summaries (3 receives + 3 activities each); run 4's history alone is left
    assert chain_of(sql, instance) == [
        (1, 6, "continued_as_new", []),
        (2, 6, "continued_as_new", [0, 1, 2]),
        (3, 6, "continued_as_new", [0, 1, 2, 3, 4, 5]),
    ]
    left = sql.execute("SELECT count(*) FROM kenning_history WHERE instance_id = %s", (instance,)).fetchone()
    assert left == (6,)
    # the CLI shows the chain: one row per run, the last one's end its status
    shown = kenning("instances", "show", instance, url=database_url)
    assert shown.returncode == 0, shown.stderr
    rows = re.findall(r"^(\d)\s+\S+\s+\S+\s+(\d+)\s+(\w+)\s*$", shown.stdout, re.MULTILINE)
    assert rows == [
        ("1", "6", "continued_as_new"),
        ("2", "6", "continued_as_new"),
        ("3", "6", "continued_as_new"),
        ("4", "6", "completed"),
    ], shown.stdout
    chain = json.loads(kenning("instances", "show", instance, "--json", url=database_url).stdout)["chain"]
    assert [(r["run"], r["steps"], r["ended"]) for r in chain][-1] == (4, 6, "completed")
    listed = json.loads(kenning("instances", "list", "--json", url=database_url).stdout)
    assert [r["run"] for r in listed if r["id"] == instance] == [4]
    # and so does the console's instance page: the run, and a row per run of the chain
    url, console = spawn_console(processes, database_url)
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        page = await http.get(f"/instances/{instance}")
    assert page.status_code == 200
    assert re.search(r"<dd data-run>4 <span", page.text), page.text
    cells = re.findall(
        r'<td data-label="Run">(\d+)</td>.*?<td data-label="Steps">(\d+)</td>\s*<td data-label="Ended as">([^<]+)</td>',
        page.text,
        re.DOTALL,
    )
    assert cells == [(str(n), "6", "continued as new") for n in (1, 2, 3)] + [("4", "6", "completed")]
    taken = sql.execute(
        "SELECT data FROM kenning_messages WHERE instance_id = %s AND consumed_step_id IS NOT NULL ORDER BY seq",
        (instance,),
    ).fetchall()
    assert taken == [(n,) for n in range(12)]
    check_invariants(sql)


async def test_a_worker_killed_mid_chain_leaves_it_to_another_with_no_message_lost_or_taken_twice(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    block = tmp_path / "block"
    block.touch()
    env = {
        "KENNING_TEST_SIDE_CHANNEL": side_channel,
        "KENNING_TEST_BLOCK_FILE": str(block),
        "KENNING_TEST_BLOCK_AT": "5",  # the second message of run 2
    }
    first = processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
    async with Client(database=database) as client:
        instance = (await client.start("collect_chain", per_run=4, runs=3, received=[])).instance_id
        for n in range(8):
            await client.send_message(instance, "items", n)
        await eventually(lambda: executions(side_channel)[f"msg {instance} 5"] == 1, timeout=30, message="5 taken")
        assert run_and_status(sql, instance) == (2, "running")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        for n in range(8, 12):
            await client.send_message(instance, "items", n)
        block.unlink()
        processes.worker(database_url, APP, "--lease-seconds", "1", env=env)
        assert await client.result(instance, timeout=30) == list(range(12))
    counts = executions(side_channel)
    # the activity in flight at the kill ran again (at-least-once); every other once
    assert {n: counts[f"msg {instance} {n}"] for n in range(12)} == {n: 2 if n == 5 else 1 for n in range(12)}
    # every message sent was taken by exactly one receive of one run: none lost, none twice
    taken = sql.execute(
        "SELECT data, consumed_step_id FROM kenning_messages WHERE instance_id = %s ORDER BY seq", (instance,)
    ).fetchall()
    assert taken == [(n, f"receive:{n % 4 + 1}") for n in range(12)]
    assert [row[:3] for row in chain_of(sql, instance)] == [(1, 8, "continued_as_new"), (2, 8, "continued_as_new")]
    assert run_and_status(sql, instance) == (3, "completed")
    check_invariants(sql)


async def test_the_worker_goes_on_with_the_next_run_without_a_new_claim(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool, side_channel: str
) -> None:
    """A chain whose mailbox is full never waits: one claim runs all its runs, each
    continue keeping the lease (kenning_instances.run_count counts the claims)."""
    async with Client(database=database) as client:
        instance = (await client.start("collect_chain", per_run=2, runs=5, received=[])).instance_id
        for n in range(10):
            await client.send_message(instance, "items", n)
        processes.worker(database_url, APP, env={"KENNING_TEST_SIDE_CHANNEL": side_channel})
        assert await client.result(instance, timeout=30) == list(range(10))
    row = sql.execute("SELECT run, run_count FROM kenning_instances WHERE id = %s", (instance,)).fetchone()
    assert row == (5, 1)
    check_invariants(sql)
