"""The instances pages: the list (filters, counts by status, keyset pages, auto-refresh)
and one instance (``kenning_console.timeline`` shapes its history, ``diagram`` draws it)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning.serialization import unstorable_reason
from kenning.storage import console as console_sql
from kenning.storage.console import Cursor, InstanceFilters
from kenning.storage.records import INSTANCE_STATUSES
from kenning_console.diagram import steps_svg
from kenning_console.pages import BadRequestError, render
from kenning_console.state import console_of
from kenning_console.timeline import timeline

SCAN_LIMIT = 10_000  # rows one page of a search judges at most (kenning.storage.console)
COUNT_CAP = 10_000  # counts by status stop here ("10,000+")
MAX_TEXT = 200  # characters of a filter field
EXISTED = "an instance with this id (or idempotency key) already existed: not started again"
FILTER_FIELDS = ("status", "workflow", "since", "until", "id", "key", "q")


async def home(request: Request) -> Response:
    return RedirectResponse("/instances", status_code=303)


def _text(request: Request, name: str) -> str:
    value = request.query_params.get(name, "").strip()
    if len(value) > MAX_TEXT:
        raise BadRequestError(f"{name} is longer than {MAX_TEXT} characters")
    if "\x00" in value:
        raise BadRequestError(f"{name} contains a NUL character")
    return value


def _time(request: Request, name: str) -> datetime | None:
    value = _text(request, name)
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequestError(f"{name}={value!r} is not a time: use 2025-01-31T14:00 (ISO 8601)") from None
    if moment.tzinfo is None:  # a browser's datetime-local input has no zone: UTC, as the pages show
        moment = moment.replace(tzinfo=UTC)
    return moment


def parse_search(text: str) -> tuple[str, str]:
    """``key=value`` (``a.b=value`` for nested keys): containment, ``value`` read as JSON
    when it is JSON (``amount=42``, ``ok=true``), else as a string; anything else: text
    contained in the input or result."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        return "", text
    try:
        value: Any = json.loads(raw, parse_constant=_no_constant)
    except _NotJsonError as error:
        raise BadRequestError(f"q: {error}") from None
    except ValueError:
        value = raw.strip()
    reason = unstorable_reason(value)
    if reason is not None:  # nothing stored holds it (PostgreSQL's jsonb would refuse the query)
        raise BadRequestError(f"q: no input or result can hold this value: {reason}")
    for part in reversed(key.split(".")):
        value = {part: value}
    return json.dumps(value), ""


class _NotJsonError(ValueError):
    pass


def _no_constant(name: str) -> Any:
    """``json.loads`` reads NaN and Infinity, which JSON (and jsonb) has not."""
    raise _NotJsonError(f"{name} is not a JSON value: no input or result holds it")


def parse_filters(request: Request) -> InstanceFilters:
    status = _text(request, "status")
    if status and status not in INSTANCE_STATUSES:
        raise BadRequestError(f"status={status!r} is not a status: one of {', '.join(INSTANCE_STATUSES)}")
    since, until = _time(request, "since"), _time(request, "until")
    if since is not None and until is not None and since >= until:
        raise BadRequestError("since must be before until")
    contains, text = parse_search(_text(request, "q"))
    return InstanceFilters(
        status=status,
        workflow=_text(request, "workflow"),
        since=since,
        until=until,
        id_prefix=_text(request, "id"),
        key_prefix=_text(request, "key"),
        contains=contains,
        text=text,
    )


def encode_cursor(cursor: Cursor) -> str:
    raw = json.dumps([cursor.created_at.isoformat(), cursor.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor | None:
    if not text:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        created, instance_id = json.loads(raw)
        moment = datetime.fromisoformat(created)
        if not isinstance(instance_id, str) or "\x00" in instance_id or moment.tzinfo is None:
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise BadRequestError("after= is not a page position this console made: start from the first page") from None
    return Cursor(moment, instance_id)


def _page_size(request: Request, default: int) -> int:
    raw = _text(request, "limit")
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 500:  # "²".isdigit(), int("²") fails
        raise BadRequestError(f"limit={raw!r} must be a whole number from 1 to 500")
    return int(raw)


async def instance_list(request: Request) -> Response:
    console = console_of(request)
    filters = parse_filters(request)
    after = decode_cursor(_text(request, "after"))
    limit = _page_size(request, console.settings.page_size)
    kept = {name: request.query_params[name] for name in FILTER_FIELDS if request.query_params.get(name)}
    exact = None
    if filters.id_prefix and after is None:  # an exact id: that instance, whatever else is asked
        exact = await console.read(lambda conn: console_sql.instance_by_id(conn, filters.id_prefix))
    if exact is not None:
        page = console_sql.InstancePage([exact], None)
    else:
        page = await console.read(
            lambda conn: console_sql.instances_page(conn, filters, after=after, limit=limit, scan_limit=SCAN_LIMIT)
        )
    counts = await console.read(lambda conn: console_sql.instances_counts(conn, filters, cap=COUNT_CAP))
    workflows = await console.read(console_sql.workflow_names)
    next_url = None
    if page.next is not None:
        query = {**kept, "after": encode_cursor(page.next)}
        if limit != console.settings.page_size:
            query["limit"] = str(limit)
        next_url = "/instances?" + urlencode(query)
    status_urls = {
        status: "/instances?" + urlencode({**{k: v for k, v in kept.items() if k != "status"}, "status": status})
        for status in INSTANCE_STATUSES
    }
    return render(
        request,
        "instances.html",
        {
            "section": "instances",
            "filters": filters,
            "form": {name: request.query_params.get(name, "") for name in FILTER_FIELDS},
            "statuses": INSTANCE_STATUSES,
            "workflows": workflows,
            "rows": page.rows,
            "scanned": page.scanned,
            "next_url": next_url,
            "first_url": "/instances?" + urlencode(kept) if after is not None else None,
            "counts": counts,
            "count_cap": COUNT_CAP,
            "status_urls": status_urls,
            "all_url": "/instances?" + urlencode({k: v for k, v in kept.items() if k != "status"}),
            "refresh_seconds": console.settings.refresh_interval if after is None else 0,
            "search_kind": "contains" if filters.contains else ("text" if filters.text else ""),
        },
    )


async def instance_page(request: Request) -> Response:
    console = console_of(request)
    instance_id = request.path_params["instance_id"]

    async def read_all(conn: Any) -> dict[str, Any] | None:
        row = await console_sql.instance(conn, instance_id)
        if row is None:
            return None
        return {
            "instance": row,
            "history": await console_sql.instance_history(conn, instance_id),
            "compensations": await console_sql.instance_compensations(conn, instance_id),
            "waits": await console_sql.instance_waits(conn, instance_id),
            "timers": await console_sql.instance_timers(conn, instance_id),
            "sent": await console_sql.instance_sent_events(conn, instance_id),
        }

    found = await console.read(read_all)
    if found is None:
        raise HTTPException(404, f"no instance {instance_id!r} (it may have expired under the retention policy)")
    items = timeline(**found)
    return render(
        request,
        "instance.html",
        {
            "section": "instances",
            **found,
            "timeline": items,
            "diagram": steps_svg(items),
            "error": found["instance"].error,
            "notice": EXISTED if request.query_params.get("existed") == "1" else None,
            "pretty": pretty,
        },
    )


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def routes() -> list[BaseRoute]:
    return [
        Route("/", home, methods=["GET"]),
        Route("/instances", instance_list, methods=["GET"]),
        Route("/instances/{instance_id:path}", instance_page, methods=["GET"]),
    ]
