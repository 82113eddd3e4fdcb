"""The shutdown grace period bounds a worker's exit (issue 13, item 3): after SIGTERM a
worker whose activities hang (an ``async`` one awaiting forever, a sync one sleeping in
its thread, which nothing can stop) still exits, with code 0, and leaves the instances
to another worker instead of holding them until SIGKILL. And a SIGTERM while a worker
starts is a clean stop too (issue 25, item 9)."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from kenning_worker.shutdown import MARGIN_SECONDS
from tests.support import REPO_ROOT, ProcessPool, eventually, executions

APP = "tests.apps.poison"
GRACE = 1.0


async def test_sigterm_exits_within_the_grace_period_though_activities_hang(
    database: Database,
    database_url: str,
    sql: psycopg.Connection[tuple[object, ...]],
    processes: ProcessPool,
    side_channel: str,
) -> None:
    env = {"KENNING_TEST_SIDE_CHANNEL": side_channel}
    # a long lease: the instances are claimable again only if the worker released them
    options = ("--shutdown-grace-seconds", str(GRACE), "--lease-seconds", "600")
    worker = processes.worker(database_url, APP, *options, env=env)
    async with Client(database=database) as client:
        await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")
        ids = [(await client.start(name)).instance_id for name in ("hung_async", "hung_sync")]
    labels = [f"hang_async {ids[0]}", f"hang_sync {ids[1]}"]
    await eventually(lambda: all(executions(side_channel)[label] == 1 for label in labels), timeout=60)

    worker.send_signal(signal.SIGTERM)
    try:  # grace + margin is the bound; the rest is slack for a loaded machine, not a timing
        code = await asyncio.to_thread(worker.wait, GRACE + MARGIN_SECONDS + 10)
    except psutil.TimeoutExpired:
        raise AssertionError("the worker did not exit after SIGTERM") from None
    assert code == 0
    log = processes.log_of(worker)
    assert '"worker.stopped"' in log and '"worker.exit_forced"' in log
    rows = sql.execute(
        "SELECT status, lease_token, available_at <= now() FROM kenning_instances WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [("pending", None, True)] * 2  # released: claimable at once, not in 600 s

    # another worker takes both over at once
    processes.worker(database_url, APP, *options, env=env)
    await eventually(lambda: all(executions(side_channel)[label] == 2 for label in labels), timeout=60)


async def _stopped_while_starting(processes: ProcessPool, database_url: str, marker: Path, delay: float) -> int:
    """Start a worker whose app writes ``marker`` when imported; SIGTERM it ``delay``
    seconds after that; its exit code."""
    env = {"KENNING_TEST_IMPORTED_FILE": str(marker), "KENNING_TEST_IMPORT_SECONDS": str(IMPORT_SECONDS)}
    worker = processes.worker(database_url, "tests.apps.slow_start", "--migrate", env=env)
    await eventually(lambda: marker.exists() or worker.poll() is not None, timeout=60, message="app imported")
    await asyncio.sleep(delay)
    worker.send_signal(signal.SIGTERM)
    try:  # slack for a loaded machine, not a timing: it exits at once
        return await asyncio.to_thread(worker.wait, 30)
    except psutil.TimeoutExpired:
        raise AssertionError(f"the worker did not exit after SIGTERM {delay} s into its start") from None


IMPORT_SECONDS = 0.5  # the app's import: the first SIGTERMs land in it
STOPS_WHILE_STARTING = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3)  # seconds after the app began to import


async def test_sigterm_while_a_worker_starts_is_a_clean_stop(
    database_url: str, processes: ProcessPool, tmp_path: Path
) -> None:
    """Issue 25, item 9: SIGTERM while the worker loads its app, migrates, connects or
    binds its metrics port exits 0, as a stop of a running worker does; it died by the
    signal (143) until ``serve`` took SIGTERM over. Each stop at its own point of the
    start, workers side by side; the last ones land after it started, the old way."""
    codes = await asyncio.gather(
        *(
            _stopped_while_starting(processes, database_url, tmp_path / f"imported-{n}", delay)
            for n, delay in enumerate(STOPS_WHILE_STARTING)
        )
    )
    assert codes == [0] * len(STOPS_WHILE_STARTING), dict(zip(STOPS_WHILE_STARTING, codes, strict=True))


@pytest.mark.parametrize("command", ["scheduler", "relayer"])
async def test_sigterm_while_the_scheduler_or_relayer_starts_is_a_clean_stop(
    command: str, database_url: str, processes: ProcessPool, tmp_path: Path
) -> None:
    """The same for the scheduler and the relayer, stopped while they load their app."""
    codes = []
    for n, delay in enumerate((0.0, 0.3)):
        marker = tmp_path / f"imported-{n}"
        env = {
            "KENNING_TEST_IMPORTED_FILE": str(marker),
            "KENNING_TEST_IMPORT_SECONDS": str(IMPORT_SECONDS),
            "KENNING_DATABASE_URL": database_url,
        }
        extra = ["--broker-url", "http://127.0.0.1:9/"] if command == "relayer" else []
        proc = processes.spawn(
            [command, "--app", "tests.apps.slow_start", "--no-migrate", *extra], env=env, name=command
        )

        def imported(marker: Path = marker, proc: psutil.Popen = proc) -> bool:
            return marker.exists() or proc.poll() is not None

        await eventually(imported, timeout=60, message="app imported")
        await asyncio.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        try:
            codes.append(await asyncio.to_thread(proc.wait, 30))
        except psutil.TimeoutExpired:
            raise AssertionError(f"{command} did not exit after SIGTERM {delay} s into its start") from None
    assert codes == [0, 0]


async def _exit_code_after_sigterm(proc: psutil.Popen, what: str) -> int:
    proc.send_signal(signal.SIGTERM)
    try:  # slack for a loaded machine, not a timing: it exits at once
        return int(await asyncio.to_thread(proc.wait, 30))
    except psutil.TimeoutExpired:
        raise AssertionError(f"{what} did not exit after SIGTERM") from None


# modules whose import ends while `kenning worker` is still importing: kenning.client within
# `import kenning` itself, kenning_worker.worker when the command's module is loaded
IMPORTED_WHILE_LOADING = ("kenning.client", "kenning_worker.worker")


@pytest.mark.parametrize("module", IMPORTED_WHILE_LOADING)
async def test_sigterm_before_a_workers_imports_finish_is_a_clean_stop(
    module: str, database_url: str, processes: ProcessPool
) -> None:
    """(issue 33, item 6) A SIGTERM before the worker's own imports are done (before its
    app's: that was issue 25's) exits 0 too; it died by the signal (-15) until the
    ``kenning`` command took SIGTERM over before importing anything of its own. Python's
    import-time report (one line as each module's import ends) says where it is."""
    worker = processes.worker(database_url, "tests.apps.slow_start", env={"PYTHONPROFILEIMPORTTIME": "1"})
    line = re.compile(rf"^import time: .*\|\s+{re.escape(module)}$", re.MULTILINE)
    await eventually(
        lambda: line.search(processes.log_of(worker)) is not None or worker.poll() is not None,
        timeout=60,
        message=f"{module} imported",
    )
    assert await _exit_code_after_sigterm(worker, f"a worker importing past {module}") == 0


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_sigterm_stops_the_ingress_with_exit_code_0(
    workers: str, database_url: str, processes: ProcessPool
) -> None:
    """(issue 33, item 6) A requested stop of ``kenning ingress`` exits 0, as the other
    services' does; it exited -15 (uvicorn raises the signal again once it has shut down)."""
    from tests.ingress_support import start_ingress

    ingress = start_ingress(processes, database_url, "--workers", workers)
    assert await _exit_code_after_sigterm(ingress.process, "the ingress") == 0


def test_a_program_that_imports_kenning_keeps_its_own_sigterm() -> None:
    """Only the ``kenning`` command's import takes SIGTERM over, not a program's."""
    shown = subprocess.run(
        [sys.executable, "-c", "import signal, kenning; print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == "True", shown.stdout + shown.stderr


FINALIZER_STOPPED = """
import os, signal, sys, time
from kenning.hosting.service import Starting

starting = Starting.catch()

class Held:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, inside the finalizer

Held()  # dropped at once: its finalizer takes the SIGTERM
sys.exit(0 if starting.stop_requested else 3)
"""


def test_sigterm_inside_a_finalizer_while_starting_prints_no_traceback() -> None:
    """The SIGTERM of a starting service raises SystemExit where the main thread is; in a
    finalizer Python reported it as "Exception ignored ... SystemExit: 0" with a traceback
    (seen in a worker stopped while it started, under load). The stop is still taken."""
    done = subprocess.run(
        [sys.executable, "-c", FINALIZER_STOPPED], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert (done.returncode, done.stderr) == (0, "")
