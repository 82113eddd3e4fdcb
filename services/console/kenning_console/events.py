"""The console's events pages: the inbox (received, delivered, parked with the reason) and
the outbox (pending, publishing, published, dead letters with the broker's answer), a
page at a time by keyset (``before``: the last row shown), and the retry of a parked
inbox row or a dead letter, each behind a confirmation page and logged."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.storage import console_actions as console_sql
from kenning.storage import outbox as outbox_sql
from kenning_console.actions import log_action
from kenning_console.pages import BadRequestError, render
from kenning_console.security import require_csrf
from kenning_console.state import console_of

_log = structlog.get_logger("kenning.console")

MAX_EVENT_TYPE_LENGTH = 4096
Box = Literal["inbox", "outbox"]
INSTANCES_PER_ROW = 3  # instances an inbox row links (started or woke); "and more" beyond


def _is_row_number(text: str) -> bool:
    """ASCII digits that fit a bigint ("²".isdigit() holds, but int("²") fails)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _filters(request: Request, statuses: dict[str, str]) -> dict[str, Any]:
    """``status``, ``type`` and ``before`` from the query string, checked."""
    query = request.query_params
    status = query.get("status") or None
    if status is not None and status not in statuses:
        raise BadRequestError(f"status must be one of {', '.join(statuses)}")
    event_type = query.get("type", "").strip() or None
    if event_type is not None and len(event_type) > MAX_EVENT_TYPE_LENGTH:
        raise BadRequestError(f"type is over {MAX_EVENT_TYPE_LENGTH} characters")
    if event_type is not None and "\x00" in event_type:
        raise BadRequestError("type contains a NUL character")
    before_text = query.get("before") or None
    before: int | None = None
    if before_text is not None:
        if not _is_row_number(before_text):
            raise BadRequestError("before must be a row number from a page's 'older' link")
        before = int(before_text)
    return {"status": status, "event_type": event_type, "before": before}


def _page_size(request: Request) -> int:
    return int(console_of(request).settings.page_size)


async def inbox(request: Request) -> Response:
    filters = _filters(request, console_sql.INBOX_STATUSES)
    limit = _page_size(request)
    console = console_of(request)
    rows = await console.read(lambda conn: console_sql.inbox_page(conn, **filters, limit=limit + 1))
    counts = await console.read(console_sql.inbox_counts)
    shown = rows[:limit]
    instances = await console.read(lambda conn: console_sql.inbox_instances(conn, shown, per_row=INSTANCES_PER_ROW + 1))
    sent = request.query_params.get("sent")
    context = {
        "rows": shown,
        "instances": instances,
        "instances_per_row": INSTANCES_PER_ROW,
        "older": rows[limit - 1].id if len(rows) > limit else None,
        "counts": counts,
        "count_cap": console_sql.COUNT_CAP,
        "statuses": console_sql.INBOX_STATUSES,
        "filters": filters,
        "notice": {
            "1": "event stored in the inbox",
            "0": "an event with this source and id was already received: not stored again",
        }.get(sent or ""),
    }
    return render(request, "events/inbox.html", context)


async def outbox(request: Request) -> Response:
    filters = _filters(request, console_sql.OUTBOX_STATUSES)
    limit = _page_size(request)
    console = console_of(request)
    rows = await console.read(lambda conn: console_sql.outbox_page(conn, **filters, limit=limit + 1))
    counts = await console.read(console_sql.outbox_counts)
    context = {
        "rows": rows[:limit],
        "older": rows[limit - 1].created_seq if len(rows) > limit else None,
        "counts": counts,
        "count_cap": console_sql.COUNT_CAP,
        "statuses": console_sql.OUTBOX_STATUSES,
        "filters": filters,
        "notice": None,
    }
    return render(request, "events/outbox.html", context)


def _inbox_id(request: Request) -> int:
    text = request.path_params["inbox_id"]
    if not _is_row_number(text):
        raise HTTPException(404, f"no inbox row {text!r}")
    return int(text)


async def _inbox_row(request: Request) -> console_sql.InboxEntry:
    inbox_id = _inbox_id(request)
    row = await console_of(request).read(lambda conn: console_sql.inbox_event(conn, inbox_id))
    if row is None:
        raise HTTPException(404, f"no inbox row {inbox_id}")
    return row


async def inbox_retry_page(request: Request) -> Response:
    return _retry_page(request, "inbox", await _inbox_row(request))


async def inbox_retry(request: Request) -> Response:
    await require_csrf(request)
    row = await _inbox_row(request)
    retried = await console_of(request).read(lambda conn: console_sql.inbox_retry_parked(conn, [row.id]))
    return _retried(request, "inbox", row, bool(retried), inbox_id=row.id)


async def _outbox_row(request: Request) -> console_sql.OutboxEntry:
    text = request.path_params["event_id"]
    try:
        event_id = str(uuid.UUID(text))
    except ValueError:
        raise HTTPException(404, f"no outbox event {text!r}") from None
    row = await console_of(request).read(lambda conn: console_sql.outbox_event(conn, event_id))
    if row is None:
        raise HTTPException(404, f"no outbox event {event_id!r}")
    return row


async def outbox_retry_page(request: Request) -> Response:
    return _retry_page(request, "outbox", await _outbox_row(request))


async def outbox_retry(request: Request) -> Response:
    await require_csrf(request)
    row = await _outbox_row(request)
    retried = await console_of(request).read(lambda conn: outbox_sql.outbox_retry_failed(conn, [row.id]))
    return _retried(request, "outbox", row, bool(retried), event_id=row.id)


def _retry_page(request: Request, box: Box, row: console_sql.InboxEntry | console_sql.OutboxEntry) -> Response:
    return render(request, "events/retry.html", {"box": box, "row": row, "parked": row.status == "failed"})


def _retried(
    request: Request, box: Box, row: console_sql.InboxEntry | console_sql.OutboxEntry, retried: bool, **row_id: Any
) -> Response:
    """The answer to a retry: the box's pending rows, or the row again (409) when it was no
    longer parked (retried or delivered meanwhile)."""
    log_action(request, f"{box}_retry", **row_id, event_type=row.event_type, retried=retried)
    if not retried:
        return render(request, "events/retry.html", {"box": box, "row": row, "parked": False}, status=409)
    return RedirectResponse(f"/events/{box}?status=pending", status_code=303)


async def events_home(request: Request) -> Response:
    return RedirectResponse("/events/inbox", status_code=303)


def routes() -> list[BaseRoute]:
    return [
        Route("/events", events_home, methods=["GET"]),
        Route("/events/inbox", inbox, methods=["GET"]),
        Route("/events/inbox/{inbox_id}/retry", inbox_retry_page, methods=["GET"]),
        Route("/events/inbox/{inbox_id}/retry", inbox_retry, methods=["POST"]),
        Route("/events/outbox", outbox, methods=["GET"]),
        Route("/events/outbox/{event_id}/retry", outbox_retry_page, methods=["GET"]),
        Route("/events/outbox/{event_id}/retry", outbox_retry, methods=["POST"]),
    ]
