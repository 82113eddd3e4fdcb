"""The console's fork: a form on an instance's page that makes a new instance with its
history before a chosen step, running today's code from that step
(``kenning instances fork``; ``kenning.client.forks``). As the other actions: a GET page
that says what will happen, a POST with the form's CSRF token that does it, logged
(``console.action``) and recorded in the operator action log (origin ``console``); then
the fork's page. A step it does not have or an input its workflow refuses comes back in
the form with the error (422; 400 for JSON that does not parse), and nothing is made.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.client.forks import ForkStepError
from kenning.commands import steering
from kenning.core.records import InstanceRow
from kenning.starting import InvalidInputError
from kenning.storage import forks as forks_sql
from kenning.storage import instances as instances_sql
from kenning_console.actions import MAX_FIELD_LENGTH, TOO_DEEP, console_who, instance_path, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

# the records the form offers as steps; a longer history's later steps are named by number
OFFERED = 1000


async def instance_row(request: Request) -> InstanceRow:
    instance_id = request.path_params["instance_id"]
    row = await console_of(request).read(lambda conn: instances_sql.instance_get(conn, instance_id))
    if row is None:
        raise HTTPException(404, f"no workflow instance {instance_id!r}")
    return row


def text_field(form: FormData, name: str) -> str:
    value = form.get(name, "")
    if not isinstance(value, str):
        raise HTTPException(400, f"{name} must be text")
    if len(value) > MAX_FIELD_LENGTH:
        raise HTTPException(413, f"{name} is over {MAX_FIELD_LENGTH} characters")
    return value


async def _render(
    request: Request, row: InstanceRow, fields: dict[str, str], error: str | None = None, status: int = 200
) -> Response:
    points = await console_of(request).read(lambda conn: forks_sql.fork_points(conn, row.id, limit=OFFERED + 1))
    context = {
        "instance": row,
        "points": points[:OFFERED],
        "more": len(points) > OFFERED,
        "fields": fields,
        "error": error,
        "original_input": json.dumps(row.input, indent=2, ensure_ascii=False, default=str),
    }
    return render(request, "actions/fork.html", context, status=status)


async def fork_page(request: Request) -> Response:
    row = await instance_row(request)
    return await _render(request, row, {"step": request.query_params.get("step", ""), "input": ""})


async def fork(request: Request) -> Response:
    form = await require_csrf(request)
    row = await instance_row(request)
    fields = {name: text_field(form, name).strip() for name in ("step", "input")}
    arguments: Any = None
    if fields["input"]:
        try:
            arguments = json.loads(fields["input"])
        except json.JSONDecodeError as error:
            return await _render(request, row, fields, f"the input is not valid JSON: {error}", 400)
        except RecursionError:
            return await _render(request, row, fields, TOO_DEEP.format(what="the input"), 400)
        if not isinstance(arguments, dict):
            message = "the input must be a JSON object: the workflow's keyword arguments"
            return await _render(request, row, fields, message, 422)
    who = console_who(request)
    try:
        forked = await console_of(request).write(
            lambda conn: steering.fork(conn, row, who, fields["step"] or "?", arguments)
        )
    except (ForkStepError, InvalidInputError) as error:
        return await _render(request, row, fields, str(error), 422)
    log_action(request, "fork", instance_id=row.id, workflow=row.workflow_name, fork_id=forked.fork_id)
    return RedirectResponse(instance_path(forked.fork_id), status_code=303)


def routes() -> list[BaseRoute]:
    return [
        Route("/instances/{instance_id:path}/fork", fork_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/fork", fork, methods=["POST"]),
    ]
