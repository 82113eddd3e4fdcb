"""The instances pages: the list (filters, counts by status, keyset pages, auto-refresh)
and one instance (``kenning_console.timeline`` shapes its history, ``diagram`` draws it).

An instance's page is bounded whatever the instance did: its history a page of
``HISTORY_PAGE`` steps at a time (keyset on the step number), with the sent events and
compensations of that page's time range (``SIDE_ROWS`` at most), and every value shown
whole only up to ``values.BOUNDS`` (a preview and a download beyond)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning import codecs
from kenning.core.published import parse_search_pair
from kenning.core.records import INSTANCE_STATUSES
from kenning.serialization import unstorable_reason
from kenning.storage import console as console_sql
from kenning.storage import flow as flow_sql
from kenning.storage import forks as forks_sql
from kenning.storage import published as published_sql
from kenning.storage import runs as runs_sql
from kenning.storage import streams as streams_sql
from kenning.storage.console import Cursor, InstanceFilters, Window
from kenning_console import bulk
from kenning_console.diagram import steps_svg
from kenning_console.live import stream_url, version
from kenning_console.pages import BadRequestError, render
from kenning_console.standing import standing
from kenning_console.state import console_of
from kenning_console.streams import SHOWN_ENTRIES, entries_url
from kenning_console.timeline import timeline
from kenning_console.values import BOUNDS, shown, stored_preview

SCAN_LIMIT = 10_000  # rows one page of a search judges at most (kenning.storage.console)
COUNT_CAP = 10_000  # counts by status stop here ("10,000+")
MAX_TEXT = 200  # characters of a filter field
EXISTED = "an instance with this id (or idempotency key) already existed: not started again"
FILTER_FIELDS = ("status", "workflow", "since", "until", "id", "key", "q", "where")
HISTORY_PAGE = 200  # steps on one page of an instance's history
SIDE_ROWS = 200  # sent events and compensations in one page's time range, waits and timers
RUNS_SHOWN = 50  # continue_as_new: the newest runs of a chain the page lists
NEWEST = 2**62  # after every step number: the newest page ends before it


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


def parse_where(pairs: list[str]) -> str:
    """``where=customer=c-1&where=region=eu``: search attributes
    (``@workflow(search_attributes=...)``) holding every pair, each read as ``kenning
    instances list --where`` reads one (``parse_search_pair``: the value as typed, commas
    and spaces too; an empty one skipped), as the JSON object ``InstanceFilters.where``
    takes ('' for none)."""
    wanted: dict[str, str] = {}
    for pair in pairs:
        if not pair.strip():  # the form's empty field for one more pair
            continue
        try:
            key, value = parse_search_pair(pair)
        except ValueError as error:
            raise BadRequestError(f"where: {error}") from None
        if wanted.get(key, value) != value:
            raise BadRequestError(f"where: {key!r} is named twice")
        wanted[key] = value
    return json.dumps(wanted) if wanted else ""


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
        where=parse_where(request.query_params.getlist("where")),
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
    # the filters as given, for the page's links: where= may come once per pair
    kept = [(name, value) for name in FILTER_FIELDS for value in request.query_params.getlist(name) if value]
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
    ids = [row.id for row in page.rows]
    status_texts = await console.read(lambda conn: published_sql.status_texts(conn, ids)) if ids else {}
    workflows = await console.read(console_sql.workflow_names)
    next_url = None
    if page.next is not None:
        query = [*kept, ("after", encode_cursor(page.next))]
        if limit != console.settings.page_size:
            query.append(("limit", str(limit)))
        next_url = "/instances?" + urlencode(query)
    unstatused = [(k, v) for k, v in kept if k != "status"]
    status_urls = {status: "/instances?" + urlencode([*unstatused, ("status", status)]) for status in INSTANCE_STATUSES}
    return render(
        request,
        "instances.html",
        {
            "section": "instances",
            "filters": filters,
            "form": {
                **{name: request.query_params.get(name, "") for name in FILTER_FIELDS},
                "where": [pair for pair in request.query_params.getlist("where") if pair.strip()],
            },
            "statuses": INSTANCE_STATUSES,
            "workflows": workflows,
            "rows": page.rows,
            "durations": {row.id: duration(row.started_at or row.created_at, row.finished_at) for row in page.rows},
            "scanned": page.scanned,
            "next_url": next_url,
            "first_url": "/instances?" + urlencode(kept) if after is not None else None,
            "counts": counts,
            # bulk actions on what the filter selects, only those that apply to its status
            "bulk": bulk.offers(filters),
            "count_cap": COUNT_CAP,
            "status_urls": status_urls,
            "all_url": "/instances?" + urlencode(unstatused),
            "refresh_seconds": console.settings.refresh_interval if after is None else 0,
            "search_kind": "contains" if filters.contains else ("text" if filters.text else ""),
            "status_texts": status_texts,  # set_status: what each row published last
        },
    )


def duration(start: datetime | None, end: datetime | None) -> str:
    """How long an ended instance took, from its start (its creation if it never ran), in
    the two largest units that say it: "850 ms", "12.3 s", "4 min 2 s", "3 h 5 min",
    "2 d 4 h"; empty while it has not ended."""
    if start is None or end is None:
        return ""
    seconds = max((end - start).total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole >= 86400:
        return f"{whole // 86400} d {whole % 86400 // 3600} h"
    if whole >= 3600:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 60} min {whole % 60} s"


def _after(request: Request) -> int | None:
    """The page of history asked for: ``after=<step number>`` (0: the first page), or None
    for ``newest=1``, the last page."""
    if request.query_params.get("newest") == "1":
        return None
    raw = _text(request, "after") or "0"
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise BadRequestError(f"after={raw!r} is not a step number")
    return int(raw)


def _page_url(instance_id: str, after: int | None) -> str:
    path = "/instances/" + quote(instance_id, safe="/")
    return path if not after else f"{path}?after={after}"


@dataclass
class HistoryPage:
    """Which steps of the history a page shows, and the links to the others."""

    first: int  # the position of its first step (1-based)
    total: int
    count: int
    next_url: str | None = None
    previous_url: str | None = None
    first_url: str | None = None
    newest_url: str | None = None
    more_sent: bool = False
    more_compensations: bool = False


async def _read_page(
    conn: Any, instance_id: str, after: int | None, *, commit_stall_seconds: float
) -> dict[str, Any] | None:
    """The instance, one page of its history (keyset on the step number) and what else
    happened in that page's time range, every value bounded; and where it stands (the
    actions accepted on it, its parent and children, what it waits for)."""
    row = await console_sql.instance(conn, instance_id, BOUNDS)
    if row is None:
        return None
    if after is None:
        after = await console_sql.instance_history_page_start(conn, instance_id, before=NEWEST, limit=HISTORY_PAGE)
    rows = await console_sql.instance_history_page(
        conn, instance_id, after=after, limit=HISTORY_PAGE + 1, bounds=BOUNDS
    )
    history, more = rows[:HISTORY_PAGE], len(rows) > HISTORY_PAGE
    position = await console_sql.instance_history_position(conn, instance_id, after)
    # the rows recorded from this page's first step (from the start on the first page) up
    # to the next page's first step (on, on the last page)
    since = history[0].created_at if after and history else None
    window = Window(since=since, until=rows[HISTORY_PAGE].created_at if more else None, limit=SIDE_ROWS + 1)
    compensations = await console_sql.instance_compensations(conn, instance_id, window, BOUNDS)
    sent = await console_sql.instance_sent_events(conn, instance_id, window, BOUNDS)
    last = not more
    page = HistoryPage(
        first=position.before + 1,
        total=position.total,
        count=len(history),
        more_sent=len(sent) > SIDE_ROWS,
        more_compensations=len(compensations) > SIDE_ROWS,
    )
    if more:
        page.next_url = _page_url(instance_id, history[-1].seq)
        page.newest_url = _page_url(instance_id, None) + "?newest=1"
    if after:
        before = history[0].seq if history else NEWEST
        start = await console_sql.instance_history_page_start(conn, instance_id, before=before, limit=HISTORY_PAGE)
        page.previous_url = _page_url(instance_id, start)
        page.first_url = _page_url(instance_id, 0)
    # continue_as_new: the newest runs of its chain, the current one last
    runs = await runs_sql.runs_list(conn, instance_id, limit=RUNS_SHOWN)
    return {
        "instance": row,
        "runs": runs,
        "history": history,
        "compensations": compensations[:SIDE_ROWS],
        "waits": await console_sql.instance_waits(conn, instance_id, limit=SIDE_ROWS, bounds=BOUNDS) if last else [],
        "timers": await console_sql.instance_timers(conn, instance_id, limit=SIDE_ROWS) if last else [],
        # a debounced burst or an event batch: its key, what it folded, what it waits for (kenning/flow.py)
        "burst": await flow_sql.burst_get(conn, instance_id),
        "sent": sent[:SIDE_ROWS],
        "now": last,
        # the first page's first step, unless measured, starts with the current run: a
        # continued instance's started_at is its first run's, which made that step as long
        # as every earlier run together
        "previous": position.previous_at if after else (runs[-1].started_at if runs else None),
        "page": page,
        "published": await published_sql.values_shown(
            conn, instance_id, limit=SIDE_ROWS, bound=BOUNDS.bound, preview=BOUNDS.preview
        ),
        "streams": await streams_sql.streams_of(conn, instance_id, limit=SIDE_ROWS),
        "forks": await forks_sql.forks_of(conn, instance_id, limit=SIDE_ROWS),  # kenning instances fork
        "standing": await standing(conn, row, commit_stall_seconds=commit_stall_seconds),
    }


def _error(row: Any) -> dict[str, Any] | None:
    """The instance's error as the page shows it: whole, or its type and message."""
    if row.error_size is None:
        return None
    if row.error_preview is None:
        error = codecs.shown(row.error)
        return error if isinstance(error, dict) else {"message": str(error)}
    return {"type": row.error_type or "error", "message": row.error_message or ""}


async def instance_page(request: Request) -> Response:
    console = console_of(request)
    instance_id = request.path_params["instance_id"]
    after = _after(request)
    stall = console.settings.commit_stall_seconds
    found = await console.read(lambda conn: _read_page(conn, instance_id, after, commit_stall_seconds=stall))
    if found is None:
        raise HTTPException(404, f"no instance {instance_id!r} (it may have expired under the retention policy)")
    page = found.pop("page")
    published = found.pop("published")  # publish_value, set_status: the latest per key
    streams = found.pop("streams")  # write_stream: shown live by the page's script
    runs = found.pop("runs")
    burst = found.pop("burst")
    forks = found.pop("forks")
    where = found.pop("standing")  # offers, parent and children, waits (kenning_console.standing)
    items = timeline(**found)
    row = found["instance"]
    values = {name: shown(row, name, instance_id, name) for name in ("input", "result", "error")}
    # a large value kept in the object store: a bounded preview of it, its download streamed
    values = {name: None if v is None else await stored_preview(v) for name, v in values.items()}
    return render(
        request,
        "instance.html",
        {
            "section": "instances",
            **found,
            "burst": burst,
            "forks": forks,
            **where,
            "timeline": items,
            "diagram": steps_svg(items),
            "error": _error(row),
            "values": values,
            "history_page": page,
            "published": published,
            "streams": [(s, entries_url(instance_id, s.key)) for s in streams],
            "shown_entries": SHOWN_ENTRIES,
            "runs": runs,
            "notice": EXISTED if request.query_params.get("existed") == "1" else None,
            "pretty": pretty,
            # the stream compares what it first reads with what this page shows
            "live_url": stream_url(instance_id, version(row.status, row.updated_at, row.lease_owner, page.total)),
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
