"""Workflows nobody has: a worker records the workflows it has in the definitions table
when it starts, and reports, once per name, pending instances of workflows that no
process ever registered (a mistyped ``kenning start``, a worker deployed without the
module): the claim only takes names a worker has, so those would wait forever unseen.

The check runs at start and then only when the worker is idle (a claim found nothing), at
most once per ``interval``: a busy worker never pays for it, and it looks at a bounded
sample of the oldest pending instances (``definitions.unknown_workflows_pending``)."""

from __future__ import annotations

import asyncio
from typing import Any

from kenning.app import App
from kenning.core.records import Definition
from kenning.db import Database
from kenning.storage import definitions as definitions_sql


class UnknownWorkflows:
    def __init__(self, database: Database, app: App, *, interval: float, log: Any) -> None:
        self.database = database
        self.interval = interval
        self.log = log
        self.definitions = [
            Definition(w.name, w.source_hash, w.source, w.retention_seconds) for w in app.registry.workflows.values()
        ]
        self.registered = not self.definitions
        self.reported: set[str] = set()
        self._idle = asyncio.Event()

    async def register(self) -> None:
        """Record this worker's workflows, so that starting one by name is known to be
        claimable; a database that does not answer yet is tried again by ``run``."""
        try:
            async with self.database.connection() as conn:
                await definitions_sql.definitions_register(conn, self.definitions)
        except Exception as error:
            self.log.warning("worker.definitions_not_registered", error=repr(error))
        else:
            self.registered = True

    async def check(self) -> None:
        async with self.database.connection() as conn:
            unknown = await definitions_sql.unknown_workflows_pending(conn)
        for entry in unknown:
            if entry.workflow_name in self.reported:
                continue
            self.reported.add(entry.workflow_name)
            self.log.warning(
                "instance.unknown_workflow",
                workflow=entry.workflow_name,
                pending=entry.instances,
                hint="no worker has this workflow: run a worker whose --app defines it, or cancel these instances",
            )

    def idle(self) -> None:
        """A claim found nothing: a good time for the next check (``run`` spaces them)."""
        self._idle.set()

    async def run(self) -> None:
        while True:
            if not self.registered:
                await self.register()
            try:
                await self.check()
            except Exception as error:  # database down: the claim loop reports it; try later
                self.log.debug("worker.unknown_check_failed", error=repr(error))
            await asyncio.sleep(self.interval)
            self._idle.clear()  # an idle spell that began before the pause is seen anew
            if self.registered:
                await self._idle.wait()
