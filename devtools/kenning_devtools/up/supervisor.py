"""Child processes that are started, watched until ready, restarted with back-off when
they crash, and stopped together.

A child that cannot start is not restarted: one that exits before it was ever ready (an
address in use, an import error, a bad setting), or that fails again the same way before it
was ready after a restart, stops the stack with its error, as uvicorn and compose do.

A child served at a URL is ready when the URL answers and the child itself listens on its
port: another server on that port (another stack's ingress, whose ``/readyz`` answers as
this one's would) once made a child that could not bind look ready, and then restarted it
for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

Say = Callable[[str], None]

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0  # a child up this long restarts quickly again after its next crash


@dataclass
class ChildSpec:
    name: str
    args: list[str]  # after ``kenning``
    ready_url: str = ""  # ready when GET answers 2xx (and the child listens on ``port``) ...
    health_file: str = ""  # ... or when this file exists
    describe: str = ""  # shown once ready (URLs)
    port: int = 0  # the TCP port of ``ready_url``


@dataclass
class Child:
    spec: ChildSpec
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = FIRST_BACKOFF
    restart_at: float | None = None  # set while waiting out the back-off after a crash
    ready: bool = False
    ever_ready: bool = False
    history: list[int] = field(default_factory=list)  # exit codes of past crashes
    last_failure: str = ""  # what its last crash said
    log_offset: int = 0  # where the log of the current run begins


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid``, or a process of its own (uvicorn's workers), listens on TCP
    ``port``."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in family:
        try:
            # psutil 6 renamed connections() to net_connections()
            sockets = (getattr(process, "net_connections", None) or process.connections)(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Linux: the child gets SIGTERM if ``kenning up`` itself dies (even by SIGKILL), so no
    process outlives the supervisor."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    def __init__(self, env: dict[str, str], log_dir: Path, say: Say) -> None:
        self.env = env
        self.log_dir = log_dir
        self.say = say
        self.children: list[Child] = []
        self.stopping = False
        self.failure: str | None = None  # why a child that could not start stopped the stack

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
            child.log_offset = log.tell()
            child.process = subprocess.Popen(
                [sys.executable, "-m", "kenning", *child.spec.args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children in order
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        child.started_at = time.monotonic()
        child.restart_at = None
        child.ready = False

    def _stopping(self) -> bool:
        return self.stopping

    async def _is_ready(self, child: Child) -> bool:
        if child.spec.ready_url:
            assert child.process is not None
            if child.spec.port and not _listens(child.process.pid, child.spec.port):
                return False  # whatever answers there is not this child
            try:
                async with httpx.AsyncClient(timeout=1.0) as client:
                    return (await client.get(child.spec.ready_url)).is_success
            except httpx.HTTPError:
                return False
        if child.spec.health_file:
            return Path(child.spec.health_file).exists()  # noqa: ASYNC240 - a stat, once per 100 ms
        return True

    async def watch(self, stop: asyncio.Event) -> None:
        """Report readiness, restart crashed children with back-off, until ``stop``.

        One pass every 100 ms; a child waiting out its back-off never holds up the others.
        """
        while not stop.is_set() and not self._stopping():
            now = time.monotonic()
            for child in self.children:
                if self._stopping():  # stop_all began while a readiness check was awaited
                    return
                assert child.process is not None
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self._spawn(child)
                    continue
                code = child.process.poll()
                if code is not None:
                    failure = self._failure(child, code)
                    if not child.ever_ready or (not child.ready and failure == child.last_failure):
                        self._cannot_start(child, code, failure)
                        return
                    child.last_failure = failure
                    self._crashed(child, code)
                elif not child.ready and await self._is_ready(child):
                    child.ready = child.ever_ready = True
                    again = f", restart {child.restarts}" if child.restarts else ""
                    suffix = f"  {child.spec.describe}" if child.spec.describe else ""
                    self.say(f"{child.spec.name:<10} ready (pid {child.process.pid}{again}){suffix}")
                elif child.ready and now - child.started_at > STABLE_AFTER:
                    child.backoff = FIRST_BACKOFF
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.1)

    def _run_log(self, child: Child) -> list[str]:
        """The lines its current run wrote (the end of them)."""
        try:
            with open(child.log_path, "rb") as log:
                log.seek(max(child.log_offset, log.seek(0, os.SEEK_END) - 64_000))
                text = log.read().decode(errors="replace")
        except OSError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip()]

    def _failure(self, child: Child, code: int) -> str:
        """The line that says why it exited: its last plain-text line (uvicorn's, argparse's,
        a CLI error, a traceback's last line) or error-level JSON line, else its exit code."""
        for line in reversed(self._run_log(child)):
            try:
                record = json.loads(line)
            except ValueError:
                return line[:300]
            if not isinstance(record, dict):
                return line[:300]
            if str(record.get("level", "")).lower() in ("error", "critical"):
                exception = str(record.get("exception", "")).strip().splitlines()[-1:]
                detail = record.get("error") or (exception[0] if exception else "")
                return f"{record.get('event', '')}: {detail}"[:300] if detail else str(record.get("event", ""))
        return f"exit code {_exit_text(code)}"

    def _cannot_start(self, child: Child, code: int, failure: str) -> None:
        child.history.append(code)
        again = "again " if child.ever_ready else ""
        self.say(
            f"{child.spec.name:<10} exited with code {_exit_text(code)} {again}before it was ready; "
            f"stopping everything (log: {child.log_path})\n    {failure}"
        )
        self.failure = f"{child.spec.name} failed at start: {failure}"

    def _crashed(self, child: Child, code: int) -> None:
        child.history.append(code)
        child.ready = False
        tail = self._run_log(child)[-3:]
        self.say(
            f"{child.spec.name:<10} exited with code {_exit_text(code)}; restarting in {child.backoff:g} s "
            f"(log: {child.log_path})" + "".join(f"\n    {line[:300]}" for line in tail)
        )
        child.restart_at = time.monotonic() + child.backoff
        child.backoff = min(child.backoff * 2, MAX_BACKOFF)
        child.restarts += 1

    async def stop_all(self, grace: float = 20.0) -> None:
        """SIGTERM every child (newest first), then SIGKILL what is left after ``grace``."""
        self.stopping = True
        running = [c for c in reversed(self.children) if c.process is not None and c.process.poll() is None]
        for child in running:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            if child not in running:
                if child.restart_at is not None:  # else it exited on its own, and was reported then
                    self.say(f"{child.spec.name:<10} stopped (was waiting to restart)")
                continue
            assert child.process is not None
            while child.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
                self.say(f"{child.spec.name:<10} killed after {grace:g} s")
            else:
                # uvicorn (ingress, sink) re-raises the SIGTERM it handled: a clean stop too
                code = child.process.returncode
                clean = code in (0, -signal.SIGTERM)
                self.say(f"{child.spec.name:<10} stopped" + ("" if clean else f" (exit code {_exit_text(code)})"))


async def wait_all_ready(supervisor: Supervisor, timeout: float, stop: asyncio.Event) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if all(c.ready for c in supervisor.children):
            return True
        await asyncio.sleep(0.05)
    return False
