"""The commit watch: a primary that takes connections and answers reads but finishes no
commit is reported by every process, within seconds.

Such a primary (its synchronous standby gone, its WAL disk full or hung) raises no error:
every statement that wrote something waits in its commit, for ever, while connects and
reads go on working. Without a watch the processes hold their work and log nothing, and
only an HTTP client timing out shows anything is wrong.

Every long-running process runs one (``kenning.hosting.presence`` starts it beside the
heartbeat): every ``PROBE_SECONDS`` it commits one small write, the process's own row of
the registry (``storage.processes.process_commit_probe``), on a connection of its own, so
the probe never queues behind the pool's users and nothing it measures is a busy pool.
The probe has no time limit on purpose: cancelling a commit that waits for a synchronous
standby does not undo it (PostgreSQL keeps it, unreplicated, with a warning), and the
question is how long commits take, not whether one can be abandoned.

While the probe in flight has waited ``stall_seconds`` or more (``--commit-stall-seconds``):

- ``verdict()`` says so ("commits not completing for 12 s"): the process's ``/readyz``
  answers 503 with it;
- one error-level line, ``database.commits_stalled``, then again every
  ``REPEAT_SECONDS`` while it lasts (never one per attempt), and
  ``database.commits_resumed`` at info once a probe's commit completes;
- ``kenning_commit_stall_seconds`` is the probe's wait (0 when commits complete).

A probe that fails (the database away, the connection broken) says nothing here: the
process's own work reports an unreachable database, and the watch connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from kenning.db import Executor
from kenning.observability.metrics import COMMIT_STALL

PROBE_SECONDS = 1.0  # from a probe's commit to the next probe
RETRY_SECONDS = 5.0  # after a probe failed: connect again
REPEAT_SECONDS = 60.0  # the error line again while commits stay stalled
MAX_TICK_SECONDS = 1.0  # the gauge and the log look at the probe at least this often

Session = Callable[[], AbstractAsyncContextManager[Executor]]
Probe = Callable[[Executor], Awaitable[None]]


class CommitWatch:
    """How long this process's commits wait: one probe at a time, timed while in flight."""

    def __init__(
        self,
        session: Session,
        probe: Probe,
        *,
        stall_seconds: float,
        log: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.probe = probe
        self.stall_seconds = stall_seconds
        self.log = log
        self.clock = clock
        self._since: float | None = None  # when the probe in flight began its write
        self._reported_at: float | None = None  # the last error line, while stalled
        self._stall_began: float | None = None  # the reported stall's first probe

    def waited(self) -> float:
        """Seconds the probe in flight has waited; 0 when none is (its commit completed)."""
        return 0.0 if self._since is None else max(0.0, self.clock() - self._since)

    def verdict(self) -> str | None:
        """Why the process is not ready (commits do not complete), or None."""
        waited = self.waited()
        if waited < self.stall_seconds:
            return None
        return f"commits not completing for {waited:.1f} s"

    async def run(self) -> None:
        """Probe, and report what the probe shows, until cancelled."""
        watching = asyncio.create_task(self._watching(), name="kenning-commit-watch")
        try:
            await self._probing()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            COMMIT_STALL.set(0)

    async def _probing(self) -> None:
        while True:
            try:
                async with self.session() as conn:
                    while True:
                        self._since = self.clock()
                        await self.probe(conn)
                        self._completed()
                        await asyncio.sleep(PROBE_SECONDS)
            except Exception as error:  # the database away: its users report that, not this
                self._since = None
                self.log.debug("database.commit_probe_failed", error=repr(error))
                await asyncio.sleep(RETRY_SECONDS)

    def _completed(self) -> None:
        self._since = None
        COMMIT_STALL.set(0)
        if self._stall_began is not None:
            stalled = self.clock() - self._stall_began
            self._reported_at = self._stall_began = None
            self.log.info("database.commits_resumed", stalled_seconds=round(stalled, 1))

    async def _watching(self) -> None:
        tick = min(MAX_TICK_SECONDS, self.stall_seconds / 4)
        while True:
            before = self.clock()
            await asyncio.sleep(tick)
            if self.clock() - before > 2 * tick + 1.0:
                # this process did not run meanwhile (SIGSTOP, a starved host): the probe's
                # answer may be waiting to be read; judge at the next tick, not now
                continue
            self.look()

    def look(self) -> None:
        """Set the gauge; log the stall when it begins, then every ``REPEAT_SECONDS``."""
        waited = self.waited()
        COMMIT_STALL.set(waited)
        cause = self.verdict()
        if cause is None:
            return
        now = self.clock()
        if self._reported_at is None or now - self._reported_at >= REPEAT_SECONDS:
            if self._stall_began is None:
                self._stall_began = self._since
            self._reported_at = now
            self.log.error(
                "database.commits_stalled",
                cause=cause,
                stalled_seconds=round(waited, 1),
                threshold_seconds=self.stall_seconds,
                hint="the primary takes connections but finishes no commit: a synchronous standby gone "
                "(synchronous_standby_names), a full or hung WAL disk; kenning why ID shows who waits",
            )
