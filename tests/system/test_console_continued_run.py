"""A continued instance's page times its current run's first step from that run's start
(issue 38, item 5). A step the worker did not measure (a wait, a message received) starts
when the record before it was written; for the first step of a run there is none, and the
console took the instance's ``started_at``, which is its first run's: the first step of a
continued run showed the whole chain's age ("took 26 s" for a receive that waited 2 s).
"""

from __future__ import annotations

import re

import httpx
import psycopg

from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool

Sql = psycopg.Connection[tuple[object, ...]]


async def test_the_first_step_of_a_continued_run_starts_with_that_run(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    # run 1 started an hour ago and ended (continued) two seconds before run 2's receive
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, run, started_at, created_at, updated_at) "
        "VALUES ('looping', 'loop', 'waiting_for_message', '{}', 2, now() - interval '1 hour', "
        "now() - interval '1 hour', now())"
    )
    sql.execute(
        "INSERT INTO kenning_instance_runs (instance_id, run, input, started_at, ended_at, steps, ended) "
        "VALUES ('looping', 1, '{}', now() - interval '1 hour', now() - interval '2 seconds', 3, 'continued_as_new')"
    )
    sql.execute(
        "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload, created_at) "
        "VALUES ('looping', 'receive:items:1', 'EventReceived', 'receive:items', '{}', now())"
    )
    url, proc = spawn_console(processes, database_url)
    await console_ready(url, proc)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        page = await client.get("/instances/looping")
    assert page.status_code == 200
    took = [float(s) for s in re.findall(r"took ([\d.]+) s", page.text)]
    assert len(took) == 1, page.text
    assert 1.0 <= took[0] < 60, f"the receive took {took[0]} s: timed from run 1's start, not run 2's"
