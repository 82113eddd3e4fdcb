"""Who is running: each process's entry in the fleet's registry (``kenning_processes``).

Every long-running process (worker, scheduler, relayer, ingress, console) runs inside
:func:`registered`: it registers at start, heartbeats every ``--presence-interval``
seconds with what it says of itself (a worker: its workflows, queues, concurrency and
how many instances it runs now), and deregisters when it stops cleanly. A process that
dies without a word (``kill -9``, a lost host) stops heartbeating; after three missed
heartbeats (``EXPIRY_INTERVALS``) it is stale: ``kenning workers list`` and the console
show it so, ``kenning why`` no longer counts it, ``kenning_processes_live`` leaves it out.
The scheduler deletes entries silent for ``FORGET_AFTER`` times their expiry.

The registry is for operators, never for correctness: no claim or lease reads it, and a
database that does not answer only delays the next heartbeat (a warning, then retried).
Beside the heartbeat, each process probes its commits on its own row
(``kenning.hosting.commitwatch``): ``Presence.commits`` says whether they complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import structlog

from kenning.db import Database, Executor
from kenning.db.errors import is_unavailable
from kenning.hosting.commitwatch import CommitWatch
from kenning.storage import processes as processes_sql

_log = structlog.get_logger("kenning.presence")

EXPIRY_INTERVALS = 3.0  # heartbeats a process may miss before it counts as stale
FORGET_AFTER = 20.0  # the scheduler deletes an entry silent for this many times its expiry
DEREGISTER_SECONDS = 2.0  # a clean stop waits this long at most for its entry's deletion

Details = Callable[[], Mapping[str, Any]]


def kenning_version() -> str:
    try:
        return importlib.metadata.version("kenning")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "unknown"


def code_version(source_hashes: Mapping[str, str]) -> str:
    """A short fingerprint of an app's workflow code (their names and source hashes): two
    workers showing the same one run the same version of the workflows."""
    digest = hashlib.sha256()
    for name in sorted(source_hashes):
        digest.update(f"{name}\0{source_hashes[name]}\n".encode())
    return digest.hexdigest()[:12]


class Presence:
    """One process's registry entry and its heartbeat."""

    def __init__(
        self,
        database: Database,
        *,
        kind: str,
        process_id: str,
        interval: float,
        commit_stall_seconds: float,
        details: Details | None = None,
        forget_stale: bool = False,
    ) -> None:
        if kind not in processes_sql.KINDS:
            raise ValueError(f"kind must be one of {', '.join(processes_sql.KINDS)}, not {kind!r}")
        self.database = database
        self.kind = kind
        self.process_id = process_id
        self.interval = interval
        self.details: Details = details or dict
        self.forget_stale = forget_stale
        self.registered = False
        self.log = _log.bind(process_id=process_id, kind=kind)
        self._failing = False  # heartbeats failing in a row: warned once
        self._registering = asyncio.Lock()  # the heartbeat and the commit probe may both register
        # whether this process's commits complete (its /readyz): probed on its registry row
        self.commits = CommitWatch(
            database.session, self.probe_commit, stall_seconds=commit_stall_seconds, log=self.log
        )

    async def probe_commit(self, conn: Executor) -> None:
        """One small committed write on this process's row, on ``conn``; a missing row
        is registered instead (a write as well), or the probe would write nothing."""
        if not await processes_sql.process_commit_probe(conn, self.process_id):
            await self.register(conn)

    async def register(self, conn: Executor | None = None) -> None:
        """Register (again), on ``conn`` or a pooled connection. The commit probe's
        registration (``conn``) says nothing when the heartbeat's got there first: both
        find no row at a process's start."""
        async with self._registering:
            if conn is None:
                async with self.database.connection() as pooled:
                    await self._register(pooled)
            else:
                await self._register(conn)
            said = conn is not None and self.registered
            self.registered = True
        if not said:
            self.log.info("process.registered")

    async def _register(self, conn: Executor) -> None:
        await processes_sql.process_register(
            conn,
            id=self.process_id,
            kind=self.kind,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=kenning_version(),
            expires_after_seconds=self.interval * EXPIRY_INTERVALS,
            details=self.details(),
        )

    async def beat(self) -> None:
        """One heartbeat (a registration if the entry is missing), and, in a scheduler,
        the deletion of entries long stale."""
        if not self.registered:
            await self.register()
        else:
            async with self.database.connection() as conn:
                found = await processes_sql.process_heartbeat(conn, self.process_id, self.details())
            if not found:  # deleted as stale while this process could not reach the database
                await self.register()
        if self.forget_stale:
            async with self.database.connection() as conn:
                forgotten = await processes_sql.processes_delete_stale(conn, forget_after=FORGET_AFTER)
            for process_id, kind in forgotten:
                self.log.info("process.forgotten", forgotten=process_id, forgotten_kind=kind)

    async def run(self) -> None:
        """Register, then heartbeat every ``interval``, until cancelled."""
        while True:
            await self.beat_logged()
            await asyncio.sleep(self.interval)

    async def beat_logged(self) -> None:
        """``beat``, its failure a warning (once while they fail in a row), never raised."""
        try:
            await self.beat()
        except Exception as error:  # never the process's end: the next beat retries
            if not self._failing:
                self.log.warning("process.heartbeat_failed", error=repr(error), unavailable=is_unavailable(error))
            self._failing = True
            return
        if self._failing:
            self.log.info("process.heartbeat_resumed")
        self._failing = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Presence]:
        """In the registry while the block runs (heartbeating from a task of its own), out
        of it once the block ends, however it ends: enter it inside the block that closes
        the database pool."""
        # registered from a task: a database that does not answer yet delays no start
        task = asyncio.create_task(self.run(), name="kenning-presence")
        watch = asyncio.create_task(self.commits.run(), name="kenning-commit-probe")
        try:
            yield self
        finally:
            for running in (watch, task):
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
            await self.deregister()

    async def deregister(self) -> None:
        if not self.registered:
            return
        try:
            async with asyncio.timeout(DEREGISTER_SECONDS), self.database.connection() as conn:
                await processes_sql.process_deregister(conn, self.process_id)
        except Exception as error:  # the entry goes stale, and the scheduler deletes it later
            self.log.warning("process.deregister_failed", error=repr(error))
            return
        self.registered = False
        self.log.info("process.deregistered")


@contextlib.asynccontextmanager
async def registered(
    database: Database,
    *,
    kind: str,
    process_id: str,
    interval: float,
    commit_stall_seconds: float,
    details: Details | None = None,
    forget_stale: bool = False,
) -> AsyncIterator[Presence]:
    """``Presence(...).running()``: the process is in the registry while the block runs."""
    presence = Presence(
        database,
        kind=kind,
        process_id=process_id,
        interval=interval,
        commit_stall_seconds=commit_stall_seconds,
        details=details,
        forget_stale=forget_stale,
    )
    async with presence.running():
        yield presence
