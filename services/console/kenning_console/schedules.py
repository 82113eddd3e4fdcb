"""The console's schedules page: every cron schedule (expression and zone, overlap policy,
paused and why, the last tick decided, the next one, the instance it started last), with
Pause, Resume and Trigger, each a form with the CSRF token, logged as ``console.action``
and recorded in the operator action log.
The same as ``kenning schedules`` (kenning/commands/schedules.py does the work)."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.commands.schedules import schedule_view, set_paused, trigger
from kenning.db import Executor
from kenning.storage import schedules as schedules_sql
from kenning.storage.schedules import ScheduleRow
from kenning_console.actions import console_who, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

MAX_REASON_LENGTH = 500
_NOTICES = {"paused": "paused", "resumed": "resumed: ticks start again from the next one", "triggered": "triggered"}


async def schedules(request: Request) -> Response:
    rows = await console_of(request).read(schedules_sql.schedules_list)
    done, name = request.query_params.get("done"), request.query_params.get("name", "")
    notice = f"{name}: {_NOTICES[done]}" if done in _NOTICES else None
    started = request.query_params.get("instance") if done == "triggered" else None
    context = {"schedules": [schedule_view(r) for r in rows], "notice": notice, "started": started}
    return render(request, "schedules/list.html", context)


async def _row(conn: Executor, name: str) -> ScheduleRow:
    row = await schedules_sql.schedule_get(conn, name)
    if row is None:
        raise HTTPException(404, f"no schedule {name!r}")
    return row


def _back(name: str, done: str, instance: str | None = None) -> Response:
    query = {"done": done, "name": name, **({"instance": instance} if instance else {})}
    return RedirectResponse(f"/schedules?{urlencode(query)}", status_code=303)


async def pause(request: Request) -> Response:
    form = await require_csrf(request)
    name = request.path_params["name"]
    who = console_who(request)
    reason = str(form.get("reason") or "").strip()[:MAX_REASON_LENGTH] or None

    async def paused(conn: Executor) -> None:
        await set_paused(conn, await _row(conn, name), who, paused=True, reason=reason)

    await console_of(request).write(paused)
    log_action(request, "schedule.pause", schedule=name, reason=reason)
    return _back(name, "paused")


async def resume(request: Request) -> Response:
    await require_csrf(request)
    name = request.path_params["name"]
    who = console_who(request)

    async def resumed(conn: Executor) -> None:
        await set_paused(conn, await _row(conn, name), who, paused=False)

    await console_of(request).write(resumed)
    log_action(request, "schedule.resume", schedule=name)
    return _back(name, "resumed")


async def trigger_now(request: Request) -> Response:
    await require_csrf(request)
    name = request.path_params["name"]
    who = console_who(request)

    async def triggered(conn: Executor) -> tuple[str, bool]:
        return await trigger(conn, await _row(conn, name), who)

    instance_id, _ = await console_of(request).write(triggered)
    log_action(request, "schedule.trigger", schedule=name, instance_id=instance_id)
    return _back(name, "triggered", instance_id)


def routes() -> list[BaseRoute]:
    return [
        Route("/schedules", schedules, methods=["GET"]),
        Route("/schedules/{name}/pause", pause, methods=["POST"]),
        Route("/schedules/{name}/resume", resume, methods=["POST"]),
        Route("/schedules/{name}/trigger", trigger_now, methods=["POST"]),
    ]
