"""Real Kenning processes for the benchmark, started the way compose starts them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil


class Fleet:
    """Processes with their logs in files; all stopped on exit."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.log_dir = Path(tempfile.mkdtemp(prefix="kenning-bench-"))
        self.procs: list[tuple[psutil.Popen, Path]] = []

    def spawn(
        self, args: Sequence[str], ready: str, env: dict[str, str] | None = None, module: str = "kenning"
    ) -> psutil.Popen:
        return self.spawn_all([(args, ready)], env, module)[0]

    def spawn_all(
        self, commands: Sequence[tuple[Sequence[str], str]], env: dict[str, str] | None = None, module: str = "kenning"
    ) -> list[psutil.Popen]:
        """Start every ``(args, ready line)`` at once, then wait for each one's ready line:
        each start-up is about half a second of imports, so side by side a fleet is up in the
        time of its slowest rather than their sum."""
        full_env = {
            **os.environ,
            "KENNING_DATABASE_URL": self.database_url,
            "KENNING_LOG_FORMAT": "json",
            "KENNING_LOG_LEVEL": "info",
            **(env or {}),
        }
        started: list[tuple[psutil.Popen, Path]] = []
        for args, _ in commands:
            log = self.log_dir / f"{args[0]}-{len(self.procs)}.log"
            with open(log, "wb") as out:
                proc = psutil.Popen(
                    [sys.executable, "-m", module, *args], env=full_env, stdout=out, stderr=subprocess.STDOUT
                )
            self.procs.append((proc, log))
            started.append((proc, log))
        deadline = time.monotonic() + 60
        for (args, ready), (proc, log) in zip(commands, started, strict=True):
            while ready not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"kenning {args[0]} did not start:\n{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.02)
        return [proc for proc, _ in started]

    def log_of(self, proc: psutil.Popen) -> Path:
        return next(log for p, log in self.procs if p is proc)

    def cpu_seconds(self, procs: Sequence[psutil.Popen]) -> float:
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def stop(self) -> None:
        for proc, _ in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except psutil.TimeoutExpired:
                proc.kill()
        self.procs.clear()


@contextlib.contextmanager
def fleet(database_url: str) -> Iterator[Fleet]:
    running = Fleet(database_url)
    try:
        yield running
    finally:
        running.stop()
    shutil.rmtree(running.log_dir, ignore_errors=True)  # kept when the block failed, for its logs
