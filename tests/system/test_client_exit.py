"""A user's program that used a ``Client`` and returned from ``asyncio.run`` without
closing it exits (issue 25, item 9): ``asyncio.run`` cancels the tasks the client left
running, and every one of them must end when cancelled. Before, such a program sometimes
never exited: psycopg_pool's maintenance worker, cancelled while it opened a connection
for the pool, took the cancellation for a failed connect and waited for its next task,
and ``asyncio.run`` waited for it with no timer (``kenning.db.pool``).

The program is a real one, run by the venv's python while real workers churn: killed and
restarted, and crash-looping on an instance that kills whichever worker runs it. Each run
must exit within ``EXIT_SECONDS`` of printing its output (a hang check, not a timing), and
its stdout must be that output alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil
import pytest

from kenning import Client
from kenning.client import ResultTimeoutError
from tests.support import REPO_ROOT, ProcessPool, workers_started

APP = "tests.apps.poison"
RUNS = 15
AT_ONCE = 3  # programs running side by side
EXIT_SECONDS = 20.0  # after its output: generous, it takes well under a second
RESULT_SECONDS = 150.0  # its workflows' results, while the workers keep dying

# Starts through wf.start() (the default client, from KENNING_DATABASE_URL) and through a
# Client of its own; awaits every result at once and reads every status at once (the pool
# grows to serve them: a connection is still being opened when main returns); returns
# without closing either client.
PROGRAM = """\
import asyncio
import json
import os

import kenning
from tests.apps.poison import bystander


async def main() -> None:
    client = kenning.Client(os.environ["KENNING_DATABASE_URL"])
    ids = [await bystander.start(value=n) for n in range(2)]
    started = await asyncio.gather(*(client.start(bystander, value=n) for n in range(2, 6)))
    ids += [s.instance_id for s in started]
    results = await asyncio.gather(*(client.result(i, timeout=float(os.environ["RESULT_SECONDS"])) for i in ids))
    rows = await asyncio.gather(*(client.status(i) for i in ids))
    print(json.dumps({"results": results, "statuses": [row.status for row in rows]}), flush=True)


asyncio.run(main())
"""


async def _run_program(program: Path, env: dict[str, str], run: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(program),
        env=env,
        cwd=program.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=RESULT_SECONDS + 30)
        except TimeoutError:
            raise AssertionError(f"run {run} printed nothing in {RESULT_SECONDS + 30} s") from None
        try:
            await asyncio.wait_for(proc.wait(), timeout=EXIT_SECONDS)
        except TimeoutError:
            raise AssertionError(f"run {run} printed its output and had not exited {EXIT_SECONDS} s later") from None
        rest, errors = await proc.stdout.read(), (await proc.stderr.read()).decode(errors="replace")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, f"run {run} exited with {proc.returncode}: {errors[-2000:]}"
    stdout = (line + rest).decode()
    try:
        printed = json.loads(stdout)
    except ValueError:
        raise AssertionError(f"run {run}'s stdout is not the JSON it printed: {stdout[:2000]!r}") from None
    assert printed == {"results": [n + 2 for n in range(6)], "statuses": ["completed"] * 6}
    assert errors == "", f"run {run} wrote to stderr: {errors[:2000]}"


async def _churn(processes: ProcessPool, workers: list[psutil.Popen], start_worker: object) -> None:
    """Kill a live worker now and then, and replace every worker that died (killed, or
    crash-looping on the poison), as a supervisor would."""
    assert callable(start_worker)
    kills = random.Random(25)
    while True:
        await asyncio.sleep(1.5)
        for n, worker in enumerate(workers):
            if worker.poll() is not None:
                workers[n] = start_worker()
        if kills.random() < 0.4:
            victim = kills.choice(workers)
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()


@pytest.mark.timeout(600)
async def test_a_program_that_leaves_its_client_open_exits_while_workers_churn(
    database_url: str, processes: ProcessPool, tmp_path: Path
) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    # a short lease: an instance held by a worker that died is taken over soon; no crash
    # loop is ever parked, so the poison keeps killing workers throughout
    options = ("--lease-seconds", "2", "--max-runs", "100000", "--concurrency", "8")

    def start_worker() -> psutil.Popen:
        return processes.worker(database_url, APP, *options, env={"KENNING_TEST_POISON_FILE": str(poison)})

    workers = [start_worker() for _ in range(3)]
    await workers_started(processes, workers)
    async with Client(database_url) as client:
        for n in range(2):
            await client.start("crash_looper", value=n)
    program = tmp_path / "user_program.py"
    program.write_text(PROGRAM)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO_ROOT),
        "KENNING_DATABASE_URL": database_url,
        "RESULT_SECONDS": str(RESULT_SECONDS),
    }
    churn = asyncio.create_task(_churn(processes, workers, start_worker))
    try:
        runs = iter(range(RUNS))

        async def lane() -> None:
            for run in runs:
                await _run_program(program, env, run)

        await asyncio.gather(*(lane() for _ in range(AT_ONCE)))
    finally:
        churn.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await churn


async def _cancelled_while_closing(close: Callable[[], Coroutine[Any, Any, None]]) -> bool:
    """Cancel a task while ``close()`` waits for the background task it stopped: whether
    the cancellation reached the task (else close swallowed it, with its own task's)."""
    closer = asyncio.create_task(close())
    await asyncio.sleep(0)  # it has cancelled its background task and waits for its end
    closer.cancel()
    try:
        await closer
    except asyncio.CancelledError:
        return True
    return False


async def test_closing_a_client_keeps_a_cancellation_of_its_closer(database_url: str) -> None:
    """``close()`` cancels the client's LISTEN task and the starter's announcer and waits
    for them; a cancellation of the task calling it meanwhile was taken for theirs and
    swallowed, and that task ran on (kenning/core/cancelling.py)."""
    client = Client(database_url)
    try:
        started = await client.start("exit_example")
        with pytest.raises(ResultTimeoutError):  # the result's LISTEN task is running now
            await client.result(started.instance_id, timeout=0.2)
        assert await _cancelled_while_closing(client.results.close)

        client.starter.announce_spacing = 600.0  # every start after the first waits for its NOTIFY
        await asyncio.gather(*(client.start("exit_example") for _ in range(4)))
        assert client.starter._announcer is not None
        assert await _cancelled_while_closing(client.starter.close)
    finally:
        await client.close()
