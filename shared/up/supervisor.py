"""Child processes that are started, watched until ready, restarted with back-off when
they crash, and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

Say = Callable[[str], None]


@dataclass
class ChildSpec:
    name: str
    args: list[str]  # after ``kenning``
    ready_url: str = ""  # ready when GET answers 2xx ...
    health_file: str = ""  # ... or when this file exists
    describe: str = ""  # shown once ready (URLs)


@dataclass
class Child:
    spec: ChildSpec
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = 1.0
    ready: bool = False
    history: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, env: dict[str, str], log_dir: Path, say: Say) -> None:
        self.env = env
        self.log_dir = log_dir
        self.say = say
        self.children: list[Child] = []
        self.stopping = False

    def start(self, spec: ChildSpec) -> Child:
        child = Child(spec, self.log_dir / f"{spec.name}.log")
        self.children.append(child)
        self._spawn(child)
        return child

    def _spawn(self, child: Child) -> None:
        if child.spec.health_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(child.spec.health_file)
        with open(child.log_path, "ab") as log:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "kenning", *child.spec.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children in order
            )
        child.started_at = time.monotonic()
        child.ready = False

    async def _is_ready(self, child: Child) -> bool:
        if child.spec.ready_url:
            try:
                async with httpx.AsyncClient(timeout=1.0) as client:
                    return (await client.get(child.spec.ready_url)).is_success
            except httpx.HTTPError:
                return False
        if child.spec.health_file:
            return Path(child.spec.health_file).exists()  # noqa: ASYNC240 - a stat, once per 100 ms
        return True

    async def watch(self, stop: asyncio.Event) -> None:
        """Report readiness, restart crashed children with back-off, until ``stop``."""
        while not stop.is_set():
            for child in self.children:
                assert child.process is not None
                code = child.process.poll()
                if code is not None:
                    await self._crashed(child, code)
                elif not child.ready and await self._is_ready(child):
                    child.ready = True
                    suffix = f"  {child.spec.describe}" if child.spec.describe else ""
                    self.say(f"{child.spec.name:<10} ready (pid {child.process.pid}){suffix}")
                elif child.ready and time.monotonic() - child.started_at > 60:
                    child.backoff = 1.0  # stayed up: the next crash restarts quickly again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.1)

    async def _crashed(self, child: Child, code: int) -> None:
        child.history.append(code)
        tail = child.log_path.read_text(errors="replace").strip().splitlines()[-3:]
        self.say(
            f"{child.spec.name:<10} exited with code {code}; restarting in {child.backoff:.0f} s "
            f"(log: {child.log_path})" + "".join(f"\n    {line[:300]}" for line in tail)
        )
        await asyncio.sleep(child.backoff)
        child.backoff = min(child.backoff * 2, 30.0)
        child.restarts += 1
        if not self.stopping:
            self._spawn(child)

    async def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every child (newest first), then SIGKILL what is left after ``grace``."""
        self.stopping = True
        for child in reversed(self.children):
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            if child.process is None:
                continue
            while child.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
            self.say(f"{child.spec.name:<10} stopped")


async def wait_all_ready(supervisor: Supervisor, timeout: float, stop: asyncio.Event) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if all(c.ready for c in supervisor.children):
            return True
        await asyncio.sleep(0.05)
    return False
