"""Rendering: the Jinja2 environment (autoescaped), ``render`` for a page, and the error
page every failure shows (a clear message and status, never a traceback)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jinja2
import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kenning import codecs
from kenning.db.errors import is_unavailable
from kenning_console.security import CSRF_FIELD, csrf_token

if TYPE_CHECKING:
    from kenning_console.state import Console

_log = structlog.get_logger("kenning.console")


class BadRequestError(HTTPException):
    """A query parameter or form field the console cannot use: a 400 page saying which."""

    def __init__(self, detail: str) -> None:
        super().__init__(400, detail)


def templates() -> Jinja2Templates:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("kenning_console", "templates"),
        autoescape=True,  # every template is HTML: escape everything not marked safe
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the test, not silently renders ""
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return Jinja2Templates(env=environment)


def render(request: Request, template: str, context: dict[str, Any] | None = None, status: int = 200) -> Response:
    """``template`` with ``context``, plus what every page uses: the CSRF token (as
    ``csrf_token`` and ``csrf_field`` for a form's hidden input) and the console settings."""
    console: Console = request.app.state.console
    full = {
        "csrf_token": csrf_token(request),
        "csrf_field_name": CSRF_FIELD,
        "login_required": bool(console.settings.admin_token),
        **(context or {}),
    }
    return console.templates.TemplateResponse(request, template, full, status_code=status)


def error_page(request: Request, status: int, message: str) -> Response:
    return render(request, "error.html", {"status": status, "message": message}, status=status)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 503:  # busy or the database away: the client tries again later
        _log.warning("console.unavailable", path=request.url.path, detail=exc.detail)
    elif exc.status_code >= 500:
        _log.error("console.http_error", path=request.url.path, status=exc.status_code, detail=exc.detail)
    return error_page(request, exc.status_code, str(exc.detail))


UNAVAILABLE = "the database is not reachable (or too slow) right now: try again in a moment"


def failure_page(request: Request, exc: Exception) -> Response:
    """The page for an exception no handler turned into one, logged once: a database
    away (refused, lost, a pool or statement timeout) is a 503 and a warning, anything
    else a 500 and an error with its traceback."""
    if is_unavailable(exc):
        _log.warning("console.database_unavailable", path=request.url.path, error=repr(exc))
        return error_page(request, 503, UNAVAILABLE)
    if isinstance(exc, codecs.CodecError):  # the console's keys: one line naming what to fix
        _log.error("console.payload_unreadable", path=request.url.path, error=str(exc))
        return error_page(request, 500, str(exc))
    _log.error("console.internal_error", path=request.url.path, error=repr(exc), exc_info=exc)
    return error_page(request, 500, "the console failed to answer this request; the details are in its log")


class ErrorPageMiddleware:
    """Turns an exception out of a handler into the error page, and does not raise it
    on: Starlette's outermost middleware would (after its own handler ran), and uvicorn
    would log the same failure again as a plain-text traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope.get("path", ""):  # no id holds a NUL (PostgreSQL's text cannot): no page
            await error_page(Request(scope, receive), 404, "no page here: the path holds a NUL character")(
                scope, receive, send
            )
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            request = Request(scope, receive)
            try:
                response = failure_page(request, exc)
            except Exception as failed:  # the error page itself failed (a template): plain text
                _log.error("console.internal_error", path=request.url.path, error=repr(failed), exc_info=failed)
                response = PlainTextResponse("500: the console failed to answer this request\n", status_code=500)
            if not started:  # else the response is cut short: all that can be done
                await response(scope, receive, send)
