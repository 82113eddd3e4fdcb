"""The console's queues page: every queue with limits (its depth, how many run now, how
long the oldest due one has waited, its limits, paused or not), with Pause and Resume,
each a form with the CSRF token, logged as ``console.action`` and recorded in the operator
action log; as ``kenning queues``."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.db import Executor
from kenning.storage import actions as actions_sql
from kenning.storage import queues as queues_sql
from kenning.storage.actions import OperatorAction
from kenning_console.actions import console_who, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of


async def queues(request: Request) -> Response:
    rows = await console_of(request).read(queues_sql.queues_overview)
    done, name = request.query_params.get("done"), request.query_params.get("name", "")
    notice = f"{name}: {done}" if done in ("paused", "resumed") else None
    context = {"queues": rows, "notice": notice}
    return render(request, "queues/list.html", context)


async def _set_paused(request: Request, paused: bool) -> Response:
    await require_csrf(request)
    name = request.path_params["name"]
    who = console_who(request)

    async def set_paused(conn: Executor) -> None:
        if not await queues_sql.queue_set_paused(conn, name, paused):
            raise HTTPException(404, f"no queue {name!r}")
        # recorded as ``kenning queues pause|resume`` records it, in the same transaction
        action = OperatorAction(
            f"queue-{'pause' if paused else 'resume'}", who.origin, who.actor, target=name, affected=1
        )
        await actions_sql.action_record(conn, action)

    await console_of(request).write(set_paused)
    log_action(request, "queue.pause" if paused else "queue.resume", queue=name)
    query = urlencode({"done": "paused" if paused else "resumed", "name": name})
    return RedirectResponse(f"/queues?{query}", status_code=303)


async def pause(request: Request) -> Response:
    return await _set_paused(request, True)


async def resume(request: Request) -> Response:
    return await _set_paused(request, False)


def routes() -> list[BaseRoute]:
    return [
        Route("/queues", queues, methods=["GET"]),
        Route("/queues/{name}/pause", pause, methods=["POST"]),
        Route("/queues/{name}/resume", resume, methods=["POST"]),
    ]
