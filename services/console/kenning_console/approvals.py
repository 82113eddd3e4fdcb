"""The console's approvals: a person approves or denies what an instance waits for in
``wait_for_approval`` (``kenning.messages``; a durable agent's tool that needs approval).

The page lists the calls the instance published as pending (its ``approvals`` value);
each decision is a form, posted with the CSRF token, that sends
``{"call_id", "approved", "reason"}`` to the instance's ``approval`` mailbox: the message
``kenning request ID approval ...`` and ``Client.request`` send. Its message id is
derived from the call, so a second click sends nothing twice; the workflow takes it,
records the decision and goes on. Each decision is logged (``console.action``).
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.core.records import InstanceRow
from kenning.messages import APPROVAL_TOPIC, APPROVALS_VALUE_KEY
from kenning.storage import instances as instances_sql
from kenning.storage import messages as messages_sql
from kenning.storage import published as published_sql
from kenning.storage.messages import SendStatus
from kenning_console.actions import _text, instance_path, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

MAX_REASON_LENGTH = 2000


async def _pending(request: Request) -> tuple[InstanceRow, list[dict[str, Any]]]:
    """The instance and the calls it waits for a decision on."""
    instance_id = request.path_params["instance_id"]
    console = console_of(request)
    row = await console.read(lambda conn: instances_sql.instance_get(conn, instance_id))
    if row is None:
        raise HTTPException(404, f"no workflow instance {instance_id!r}")
    read = await console.read(lambda conn: published_sql.value_get(conn, instance_id, APPROVALS_VALUE_KEY))
    value = read.value.value if read is not None and read.value is not None else None
    pending = value.get("pending") if isinstance(value, dict) else None
    calls = [call for call in pending or [] if isinstance(call, dict) and isinstance(call.get("call_id"), str)]
    return row, calls


async def approvals_page(request: Request) -> Response:
    row, calls = await _pending(request)
    return render(request, "actions/approvals.html", {"instance": row, "calls": calls, "refused": None})


async def decide(request: Request) -> Response:
    form = await require_csrf(request)  # the checked form (every console form is url-encoded)
    row, calls = await _pending(request)
    call_id, decision = _text(form, "call_id"), _text(form, "decision")
    reason = _text(form, "reason").strip() or None
    if decision not in ("approve", "deny"):
        raise HTTPException(400, "decision must be approve or deny")
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise HTTPException(413, f"reason is over {MAX_REASON_LENGTH} characters")
    if call_id not in {call["call_id"] for call in calls}:
        refused = f"no approval is waiting for call {call_id!r}: it was decided already, or never asked"
        context = {"instance": row, "calls": calls, "refused": refused}
        return render(request, "actions/approvals.html", context, status=409)
    data = {"call_id": call_id, "approved": decision == "approve", "reason": reason}

    async def send(conn: Any) -> SendStatus:
        await messages_sql.mailbox_lock(conn, row.id)
        sent = await messages_sql.message_send(
            conn,
            instance_id=row.id,
            topic=APPROVAL_TOPIC,
            message_id=f"console-approval:{call_id}",
            data=data,
            sender_instance_id=None,
        )
        return sent.status

    status = await console_of(request).write(send)
    log_action(request, "approval", instance_id=row.id, call_id=call_id, approved=data["approved"])
    if status in (SendStatus.UNKNOWN_INSTANCE, SendStatus.FINISHED):
        context = {"instance": row, "calls": [], "refused": f"it has ended ({row.status}): nothing waits"}
        return render(request, "actions/approvals.html", context, status=409)
    return RedirectResponse(instance_path(row.id), status_code=303)


def routes() -> list[BaseRoute]:
    return [
        Route("/instances/{instance_id:path}/approvals", approvals_page, methods=["GET"]),
        Route("/instances/{instance_id:path}/approvals", decide, methods=["POST"]),
    ]
