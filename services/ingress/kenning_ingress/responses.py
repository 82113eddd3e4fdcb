"""JSON answers of the ingress: every error has ``error``, ``error_type`` and ``retryable``.

Error bodies say what happened, never where or how: no database host or port, no SQL
text or parameters (which may hold a lease token), no driver detail. The log has those.
"""

from __future__ import annotations

from typing import Any

import psycopg
from starlette.responses import JSONResponse

from kenning.db import errors as dberrors
from kenning.db.errors import is_unavailable
from kenning.errors import ObjectStoreError

# SQLAlchemy appends these to a driver error's text; everything from there on is internals
_INTERNALS_MARKERS = ("\n[SQL: ", "\n[parameters: ", "\n(Background on this error")


def accepted(**fields: Any) -> JSONResponse:
    return JSONResponse({"status": "accepted", **fields}, status_code=202)


def error(
    status_code: int,
    message: str,
    error_type: str,
    *,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    extra = dict(headers or {})
    if status_code == 401:
        extra["WWW-Authenticate"] = "Bearer"
    if retryable and status_code == 503:
        extra["Retry-After"] = "1"
    return JSONResponse(
        {"error": message, "error_type": error_type, "retryable": retryable},
        status_code=status_code,
        headers=extra or None,
    )


def database_unavailable(detail: str = "") -> JSONResponse:
    message = "the database is unavailable" + (f": {detail}" if detail else "; try again shortly")
    return error(503, message, "database_unavailable", retryable=True)


def object_store_unavailable() -> JSONResponse:
    """An event whose data is above ``KENNING_OFFLOAD_BYTES`` while the object store fails
    (the log names the store and the error)."""
    message = "the object store is unavailable; the event's data is too large to keep without it: try again shortly"
    return error(503, message, "object_store_unavailable", retryable=True)


def without_internals(message: str) -> str:
    """A stored error message as a client may read it: SQLAlchemy's ``[SQL: ...]`` and
    ``[parameters: ...]`` sections cut off."""
    cut = min((message.find(marker) for marker in _INTERNALS_MARKERS if marker in message), default=-1)
    return message[:cut] if cut >= 0 else message


def failure(exc: BaseException) -> tuple[JSONResponse, bool]:
    """The answer to an exception raised while talking to the database, and whether it
    is unexpected (to be logged with its traceback). Never a traceback page."""
    if isinstance(exc, ObjectStoreError):  # a large event's data had nowhere to go: the store's, retry
        return object_store_unavailable(), False
    if isinstance(exc, psycopg.Error) or dberrors.is_sqlalchemy_error(exc, "DBAPIError"):
        sqlstate = dberrors.sqlstate(exc) or ""
        # data exception, or a program limit (an id too long for its index): the event's fault.
        # The server's primary message names the problem, not the statement or its values.
        if sqlstate[:2] in ("22", "54"):
            diag = getattr(dberrors.driver_error(exc), "diag", None)
            primary = getattr(diag, "message_primary", None) or "the value cannot be stored"
            return error(
                400, f"the database rejected the event: {primary} (SQLSTATE {sqlstate})", "invalid_data"
            ), False
        if sqlstate == "42P01":
            return database_unavailable("the schema is missing; run kenning migrate"), False
        if is_unavailable(exc):
            return database_unavailable(), False
    elif is_unavailable(exc):
        return database_unavailable(), False
    return error(500, "internal error; the event was not stored", "internal_error", retryable=True), True
