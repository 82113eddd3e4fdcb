"""The console's Actions page (``/actions``): the operator action log, newest first, as
``kenning actions list`` shows it (``kenning.storage.actions.actions_list``): every cancel,
retry, terminate, skipped compensation, bulk action, queue pause and schedule action,
from the CLI, the console or an assistant, with when, from where and who, on what (an
instance, a queue, a schedule, or a bulk action's filter), how many rows it changed and
why. Filtered by target and kind, a page at a time (keyset on the record's id)."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kenning.storage import actions as actions_sql
from kenning_console.pages import BadRequestError, render
from kenning_console.state import console_of

MAX_TEXT = 200  # characters of a filter field
# the actions whose target is an instance id: the page links them to the instance
INSTANCE_ACTIONS = frozenset({"cancel", "retry", "terminate", "skip-compensation", "fork"})


def _text(request: Request, name: str) -> str:
    value = request.query_params.get(name, "").strip()
    if len(value) > MAX_TEXT or "\x00" in value:
        raise BadRequestError(f"{name} must be text of at most {MAX_TEXT} characters")
    return value


async def action_log(request: Request) -> Response:
    console = console_of(request)
    target, kind, before_text = _text(request, "target"), _text(request, "kind"), _text(request, "before")
    if before_text and not (before_text.isascii() and before_text.isdigit() and len(before_text) < 19):
        raise BadRequestError(f"before={before_text!r} is not an action's number")
    before = int(before_text) if before_text else None
    limit = console.settings.page_size
    rows = await console.read(
        lambda conn: actions_sql.actions_list(
            conn, target=target or None, action=kind or None, before=before, limit=limit + 1
        )
    )
    kept = [(name, value) for name, value in (("target", target), ("kind", kind)) if value]
    next_url = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_url = "/actions?" + urlencode([*kept, ("before", str(rows[-1].id))])
    context = {
        "section": "actions",
        "rows": rows,
        "form": {"target": target, "kind": kind},
        "next_url": next_url,
        "first_url": "/actions?" + urlencode(kept) if before is not None else None,
        "instance_actions": INSTANCE_ACTIONS,
    }
    return render(request, "actionlog/list.html", context)


def routes() -> list[BaseRoute]:
    return [Route("/actions", action_log, methods=["GET"])]
