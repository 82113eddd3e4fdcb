"""The escape hatches on an instance's page: terminate it, skip one of its compensations.

Each is a GET page that says what will happen (and, when it would be refused, why) and a
POST with the form's CSRF token and the operator's reason that does it, through
``kenning instances terminate`` and ``kenning instances skip-compensation``'s functions
(``kenning.commands.steering``): the same statements, the same refusals, recorded in the
operator action log in the same transaction with origin ``console``, and logged as
``console.action`` like the console's other actions.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.commands import steering
from kenning.core.records import InstanceRow
from kenning.storage import escapes as escapes_sql
from kenning_console.actions import console_who, instance_of, instance_path, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

MAX_REASON = 2000  # characters of an operator's reason


def _reason(form: Any) -> tuple[str, str | None]:
    """The form's reason, and the error that refuses it (a reason is required: it is recorded)."""
    value = form.get("reason", "")
    reason = value.strip() if isinstance(value, str) else ""
    if not reason:
        return reason, "give a reason: it is recorded in the operator action log"
    if len(reason) > MAX_REASON or "\x00" in reason:
        return reason[:MAX_REASON], f"the reason must be text of at most {MAX_REASON} characters"
    return reason, None


# ------------------------------------------------------------------ terminate


def _terminate_context(row: InstanceRow, refused: str | None, reason: str = "", error: str | None = None) -> Any:
    return {"section": "instances", "instance": row, "refused": refused, "reason": reason, "error": error}


async def terminate_page(request: Request) -> Response:
    row = await instance_of(request)
    refused = steering.refusal("terminate", row)
    return render(request, "actions/terminate.html", _terminate_context(row, refused))


async def terminate(request: Request) -> Response:
    form = await require_csrf(request)
    row = await instance_of(request)
    reason, wrong = _reason(form)
    if wrong is not None:
        return render(request, "actions/terminate.html", _terminate_context(row, None, reason, wrong), status=422)
    who = console_who(request)
    outcome = await console_of(request).write(lambda conn: steering.terminate(conn, row, who, reason))
    log_action(request, "terminate", instance_id=row.id, workflow=row.workflow_name, done=outcome.done)
    if not outcome.done:
        return render(request, "actions/terminate.html", _terminate_context(row, outcome.message), status=409)
    return RedirectResponse(instance_path(row.id), status_code=303)


# ------------------------------------------------------------------ skip a compensation


async def _skip_context(
    request: Request, row: InstanceRow, reason: str = "", error: str | None = None, chosen: str = ""
) -> dict[str, Any]:
    """The compensations still to run (newest first, as they run), the one failing
    preselected when it is the only one, and why a skip would be refused."""

    async def read(conn: Any) -> tuple[str | None, list[escapes_sql.FailingCompensation]]:
        return await steering.refusal_now(conn, "skip-compensation", row), await escapes_sql.compensations_open(
            conn, row.id
        )

    refused, open_ones = await console_of(request).read(read)
    failing = [c for c in open_ones if c.failed or c.attempts]
    if not chosen and len(failing) == 1:
        chosen = failing[0].comp_id
    return {
        "section": "instances",
        "instance": row,
        "refused": refused,
        "compensations": open_ones,
        "chosen": chosen,
        "reason": reason,
        "error": error,
    }


async def skip_page(request: Request) -> Response:
    row = await instance_of(request)
    return render(request, "actions/skip.html", await _skip_context(request, row))


async def skip(request: Request) -> Response:
    form = await require_csrf(request)
    row = await instance_of(request)
    reason, wrong = _reason(form)
    value = form.get("compensation", "")
    chosen = value.strip() if isinstance(value, str) else ""
    if wrong is None and not chosen:
        wrong = "choose the compensation to skip"
    if wrong is not None:
        context = await _skip_context(request, row, reason, wrong, chosen)
        return render(request, "actions/skip.html", context, status=422)
    who = console_who(request)
    outcome = await console_of(request).write(lambda conn: steering.skip_compensation(conn, row, who, reason, chosen))
    fields = {"instance_id": row.id, "workflow": row.workflow_name, "compensation": chosen, "done": outcome.done}
    log_action(request, "skip-compensation", **fields)
    if not outcome.done:
        context = await _skip_context(request, row, reason, None, chosen)
        context["refused"] = outcome.message
        return render(request, "actions/skip.html", context, status=409)
    return RedirectResponse(instance_path(row.id), status_code=303)


def routes() -> list[BaseRoute]:
    return [
        Route("/instances/{instance_id:path}/terminate", terminate_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/terminate", terminate, methods=["POST"]),
        Route("/instances/{instance_id:path}/skip-compensation", skip_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/skip-compensation", skip, methods=["POST"]),
    ]
