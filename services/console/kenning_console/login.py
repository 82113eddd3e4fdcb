"""``/login`` and ``/logout``: a browser proves it knows ``KENNING_ADMIN_TOKEN`` once and
gets the session cookie (``kenning_console.security``)."""

from __future__ import annotations

import asyncio

import structlog
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kenning_console.pages import render
from kenning_console.security import (
    SESSION_COOKIE,
    WRONG_TOKEN_DELAY,
    cookie_header,
    is_https,
    require_csrf,
    safe_next,
    session_value,
    token_matches,
)
from kenning_console.state import console_of

_log = structlog.get_logger("kenning.console")


async def login_form(request: Request) -> Response:
    return render(request, "login.html", {"next": safe_next(request.query_params.get("next", "/")), "failed": False})


async def login(request: Request) -> Response:
    console = console_of(request)
    form = await require_csrf(request)
    target = safe_next(str(form.get("next", "/")))
    token = console.settings.admin_token
    presented = form.get("token")
    if not token:  # an open console: nothing to log in to
        return RedirectResponse(target, status_code=303)
    if not isinstance(presented, str) or not token_matches(presented, token):
        _log.warning("console.login_failed", client=request.client.host if request.client else None)
        await asyncio.sleep(WRONG_TOKEN_DELAY)  # this request only: others are answered meanwhile
        return render(request, "login.html", {"next": target, "failed": True}, status=401)
    _log.info("console.login", client=request.client.host if request.client else None)
    response = RedirectResponse(target, status_code=303)
    response.headers.append(
        "set-cookie",
        cookie_header(
            SESSION_COOKIE,
            session_value(token),
            secure=is_https(request.scope),
            max_age=round(console.settings.session_hours * 3600),
        ),
    )
    return response


async def logout(request: Request) -> Response:
    await require_csrf(request)
    response = RedirectResponse("/login", status_code=303)
    response.headers.append("set-cookie", cookie_header(SESSION_COOKIE, "", secure=is_https(request.scope), max_age=0))
    return response


def routes() -> list[BaseRoute]:
    return [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
    ]
