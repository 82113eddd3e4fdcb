"""The console's workers page: every process of the fleet's registry (workers,
schedulers, relayers, ingresses, consoles), live or stale, with what each says of itself
(a worker's workflows, queues and how busy it is); and the console's own entry in it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kenning.hosting.config import process_id
from kenning.hosting.presence import Presence
from kenning.storage import processes as processes_sql
from kenning_console.pages import BadRequestError, render
from kenning_console.state import Console, console_of


async def workers(request: Request) -> Response:
    kind = request.query_params.get("kind") or None
    if kind is not None and kind not in processes_sql.KINDS:
        raise BadRequestError(f"kind must be one of {', '.join(processes_sql.KINDS)}")
    entries = await console_of(request).read(lambda conn: processes_sql.processes_list(conn, kind=kind))
    live = [e for e in entries if e.live]
    context = {
        "entries": entries,
        "kind": kind,
        "kinds": processes_sql.KINDS,
        "live_count": len(live),
        "stale_count": len(entries) - len(live),
    }
    return render(request, "workers/list.html", context)


def routes() -> list[BaseRoute]:
    return [Route("/workers", workers, methods=["GET"])]


@contextlib.asynccontextmanager
async def present(console: Console) -> AsyncIterator[None]:
    """The console in the fleet's registry while it serves (after its pool is open)."""
    assert console.database is not None, "the console is not started"
    settings = console.settings
    presence = Presence(
        console.database,
        kind="console",
        process_id=process_id("console-"),
        interval=settings.presence_interval,
        commit_stall_seconds=settings.commit_stall_seconds,
        details=lambda: {"listen": f"{settings.host}:{settings.port}", "app": settings.app},
    )
    console.readiness = presence.commits.verdict
    async with presence.running():
        yield
