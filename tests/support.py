"""Helpers for tests: waiting on conditions, real OS processes, the side channel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from kenning.app import App
from kenning.db import Database
from kenning.storage.server import server_backend_pid
from kenning_worker import Worker, WorkerSettings
from tests import logguard
from tests.invariants import check_invariants as check_invariants  # its callers import it from here
from tests.logguard import LogGuard
from tests.ports import free_port as free_port  # the one way a test gets a port: tests/ports.py
from tests.ports import free_ports as free_ports
from tests.sidechannel import executions as executions  # and these
from tests.sidechannel import record_execution as record_execution

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


async def eventually(
    predicate: Callable[[], Awaitable[T] | T], timeout: float = 15.0, interval: float = 0.02, message: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if asyncio.iscoroutine(last) or isinstance(last, Awaitable):
            last = await last
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {message or predicate} (last: {last!r})")
        await asyncio.sleep(interval)


async def until_answering(health_url: str, proc: psutil.Popen, what: str, *, log_path: Path | None = None) -> None:
    """Wait until ``GET health_url`` answers 200; fail at once (with its log, if given)
    when ``proc`` exits first."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"{what} exited with {proc.returncode}" + (f": {log_path.read_text()}" if log_path else "")
            )
        try:
            return httpx.get(health_url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    await eventually(answers, timeout=20, interval=0.05, message=f"{what} answers {health_url}")


async def backend_pid(db: Database) -> int:
    """The server process behind the connection ``db`` hands out next."""
    async with db.connection() as conn:
        return await server_backend_pid(conn)


async def backend_pids_held_together(db: Database, count: int) -> set[int]:
    """The server processes behind ``count`` of ``db``'s connections, all held at once (a
    barrier: on a loaded machine, calls that only overlap in time may share one)."""
    together = asyncio.Barrier(count)

    async def one() -> int:
        async with db.connection() as conn:
            async with asyncio.timeout(10):
                await together.wait()
            return await server_backend_pid(conn)

    return set(await asyncio.gather(*(one() for _ in range(count))))


def run_kenning(args: Sequence[str], env: dict[str, str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m kenning ARGS`` to completion with exactly ``env`` (plus the checkout
    on ``PYTHONPATH`` and JSON logs); its output goes to the running test's log guard."""
    done = subprocess.run(
        [sys.executable, "-m", "kenning", *args],
        env={"PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json", **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    guard = logguard.current()
    if guard is not None:
        guard.watch_text(f"kenning {' '.join(args[:2])}", done.stdout + "\n" + done.stderr)
    return done


def kenning_command(*args: str, url: str = "", pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """An operator's command in a clean environment: nothing of this shell's ``KENNING_*``
    leaks in; ``url`` is the database, ``pythonpath`` adds a folder of the test's own."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(p for p in (str(REPO_ROOT), pythonpath) if p)}
    if url:
        env["KENNING_DATABASE_URL"] = url
    return run_kenning(args, env)


async def workers_started(processes: ProcessPool, workers: Sequence[psutil.Popen], timeout: float = 60) -> None:
    """Wait until every one of ``workers`` logged ``worker.started``."""
    await eventually(
        lambda: all('"worker.started"' in processes.log_of(w) for w in workers), timeout=timeout, message="workers up"
    )


class ProcessPool:
    """Real ``kenning`` processes started as compose would, stopped at test end."""

    def __init__(self, log_dir: str, guard: LogGuard | None = None) -> None:
        self.log_dir = log_dir
        self.guard = guard
        self.procs: list[tuple[psutil.Popen, Path]] = []

    def spawn(self, args: Sequence[str], env: dict[str, str] | None = None, name: str = "proc") -> psutil.Popen:
        log_path = Path(self.log_dir) / f"{name}-{len(self.procs)}.log"
        # PYTHONUNBUFFERED left out, as under a supervisor that does not set it: what a test
        # reads in a process's log is there whether or not the shell that ran pytest had it
        inherited = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
        full_env = {**inherited, "PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json", **(env or {})}
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            proc = psutil.Popen(
                [sys.executable, "-m", "kenning", *args],
                env=full_env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log_path))
        if self.guard is not None:
            self.guard.watch_file(log_path.stem, log_path)
        return proc

    def worker(self, database_url: str, app: str, *extra: str, env: dict[str, str] | None = None) -> psutil.Popen:
        return self.spawn(
            ["worker", "--app", app, "--no-migrate", "--poll-interval", "0.2", *extra],
            env={"KENNING_DATABASE_URL": database_url, **(env or {})},
            name="worker",
        )

    def log_of(self, proc: psutil.Popen) -> str:
        for candidate, path in self.procs:
            if candidate is proc:
                return path.read_text(errors="replace")
        return ""

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.status() == psutil.STATUS_STOPPED:
                    proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            except psutil.NoSuchProcess:
                pass


@contextlib.asynccontextmanager
async def running_worker(database: Database, app: App | None = None, **settings: Any) -> Any:
    """An in-process worker on this event loop, for tests that need no process boundary."""
    options = {"poll_interval": 0.05, "lease_seconds": 5.0, "shutdown_grace_seconds": 2.0, **settings}
    worker = Worker(database, app or App(), WorkerSettings(**options))
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=15)


def iter_lines(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())
