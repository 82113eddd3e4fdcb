"""JSON answers of the ingress: every error has ``error``, ``error_type`` and ``retryable``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError
from starlette.responses import JSONResponse

from kenning.dberrors import is_unavailable


def accepted(**fields: Any) -> JSONResponse:
    return JSONResponse({"status": "accepted", **fields}, status_code=202)


def error(status_code: int, message: str, error_type: str, *, retryable: bool = False) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status_code == 401 else None
    if retryable and status_code == 503:
        headers = {"Retry-After": "1"}
    return JSONResponse(
        {"error": message, "error_type": error_type, "retryable": retryable}, status_code=status_code, headers=headers
    )


def database_unavailable(detail: str) -> JSONResponse:
    return error(503, f"the database is unavailable: {detail}", "database_unavailable", retryable=True)


def failure(exc: BaseException) -> tuple[JSONResponse, bool]:
    """The answer to an exception raised while talking to the database, and whether it
    is unexpected (to be logged with its traceback). Never a traceback page."""
    if isinstance(exc, DBAPIError):
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        detail = (str(exc.orig) if exc.orig is not None else str(exc)).strip().splitlines()
        first = detail[0] if detail else type(exc).__name__
        # data exception, or a program limit (an id too long for its index): the event's fault
        if sqlstate[:2] in ("22", "54"):
            return error(400, f"the database rejected the event: {first}", "invalid_data"), False
        if sqlstate == "42P01":
            return database_unavailable("the schema is missing; run kenning migrate"), False
        if is_unavailable(exc):
            return database_unavailable(first), False
    elif is_unavailable(exc):
        return database_unavailable(str(exc) or type(exc).__name__), False
    return error(500, "internal error; the event was not stored", "internal_error", retryable=True), True
