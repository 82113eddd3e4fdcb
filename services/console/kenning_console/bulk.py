"""Bulk actions on the instances list's filter: cancel, retry or terminate every instance
the filter (workflow, status) selects, behind a confirmation that shows the count.

The same action as ``kenning instances cancel|retry|terminate --workflow --status``
(``kenning.commands.steering.bulk``): a filter never selects a status the action would
refuse, the count is taken first, the work goes in batches of short transactions, and
the operator action log records it once, with the console's admin and address.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kenning.commands import steering
from kenning.errors import UsageError
from kenning.storage.console import InstanceFilters
from kenning_console.actions import console_who, log_action
from kenning_console.pages import render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

ACTIONS = ("cancel", "retry", "terminate")


def offers(filters: InstanceFilters) -> list[tuple[str, str]]:
    """(action, its confirmation page) for the list as filtered: only when the filter is
    a status (and a workflow), which the bulk action selects exactly, and only the
    actions that apply to that status (none on the unfiltered list: a bulk action
    names what it acts on)."""
    narrowed = filters.since or filters.until or filters.id_prefix or filters.key_prefix
    if not filters.status or narrowed or filters.contains or filters.text or filters.where:
        return []
    return [
        (
            action,
            "/instances/bulk?" + urlencode({"action": action, "workflow": filters.workflow, "status": filters.status}),
        )
        for action in ACTIONS
        if filters.status in steering.BULK_STATUSES[action]
    ]


def _chosen(values: Any) -> tuple[str, str, str]:
    action, workflow, status = (str(values.get(k, "")).strip() for k in ("action", "workflow", "status"))
    if action not in ACTIONS:
        raise HTTPException(400, f"action must be one of {', '.join(ACTIONS)}")
    if not status:
        raise HTTPException(400, "a bulk action needs a status to act on: filter the list by one first")
    return action, workflow, status


def _filter(action: str, workflow: str, status: str) -> Any:
    try:
        return steering.bulk_filter(action, [status], workflow=workflow or None)
    except UsageError as refused:
        raise HTTPException(400, str(refused)) from None


async def confirm_page(request: Request) -> Response:
    action, workflow, status = _chosen(request.query_params)
    selected = _filter(action, workflow, status)
    database = console_of(request).database
    assert database is not None
    counted = await steering.bulk(database, action, selected, console_who(request), dry_run=True)
    context = {"action": action, "workflow": workflow, "status": status, "count": counted.matched, "result": None}
    return render(request, "actions/bulk.html", {"section": "instances", **context})


async def apply(request: Request) -> Response:
    form = await require_csrf(request)  # the checked form (every console form is url-encoded)
    action, workflow, status = _chosen(form)
    reason = str(form.get("reason", "")).strip() or None
    if action == "terminate" and reason is None:
        raise HTTPException(400, "terminate needs a reason: it ends the instances without compensating")
    selected = _filter(action, workflow, status)
    database = console_of(request).database
    assert database is not None
    result = await steering.bulk(database, action, selected, console_who(request), reason=reason)
    log_action(request, f"bulk-{action}", workflow=workflow or None, status=status, affected=result.affected)
    context = {"action": action, "workflow": workflow, "status": status, "count": result.matched, "result": result}
    return render(request, "actions/bulk.html", {"section": "instances", **context})


def routes() -> list[BaseRoute]:
    return [
        Route("/instances/bulk", confirm_page, methods=["GET"]),
        Route("/instances/bulk", apply, methods=["POST"]),
    ]
