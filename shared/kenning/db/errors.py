"""Which database errors mean "the database is away" (try again later) rather than "this
write is wrong": the ingress answers the first with 503, and group commit retries a
failed batch caller by caller only for the second. Among the second, a data exception
means the value itself can never be stored: the replay engine makes it the step's error.

Kenning's own statements raise psycopg's errors (``kenning.db``); statements run through
SQLAlchemy (``ctx.session``, handlers) raise them wrapped in ``DBAPIError``. Both are
judged by the psycopg error underneath.

SQLAlchemy's errors are looked up only in a process that has imported SQLAlchemy: none
can exist in one that has not, and most processes never need it (see ``kenning.db``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

import psycopg

from kenning.errors import DatabaseUnavailableError

if TYPE_CHECKING:
    from sqlalchemy.exc import DBAPIError

# connection exception, insufficient resources, operator intervention, rollback
# (serialization failure, deadlock): none says anything about the data written
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "40")
# and the session bounds' (kenning.db.bounds): a session ended for idling in a transaction
# (25P03), a lock not had within the lock timeout (55P03); statement_timeout is 57014
_UNAVAILABLE_SQLSTATES = ("25P03", "55P03")
# data exception, program limit exceeded (a value too large for jsonb, an index row too
# large): the value written is refused, now and on every try
_DATA_SQLSTATE_CLASSES = ("22", "54")


def is_sqlalchemy_error(error: BaseException, *kinds: str) -> bool:
    """Whether ``error`` is one of SQLAlchemy's: of one of ``kinds`` (class names in
    ``sqlalchemy.exc``), any of them if none is named."""
    errors = sys.modules.get("sqlalchemy.exc")
    return errors is not None and isinstance(
        error, tuple(getattr(errors, kind) for kind in kinds or ("SQLAlchemyError",))
    )


def _is_wrapper(error: BaseException) -> TypeGuard[DBAPIError]:
    return is_sqlalchemy_error(error, "DBAPIError")


def driver_error(error: BaseException) -> BaseException:
    """The psycopg error under a SQLAlchemy wrapper, or ``error`` itself."""
    if _is_wrapper(error) and isinstance(error.orig, BaseException):
        return error.orig
    return error


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error (``"23505"``…), wrapped or not; None without one."""
    return getattr(driver_error(error), "sqlstate", None) or None


def is_unavailable(error: BaseException) -> bool:
    """By SQLSTATE class, not by exception type: psycopg raises ``OperationalError`` for
    program limits (54: an index row too large) and object states (55) too, which are one
    write's fault. Without a SQLSTATE, an operational or interface error is the
    connection's (a refused connect, a lost server, a pool that had no connection)."""
    if isinstance(error, DatabaseUnavailableError):  # a client's, raised after its own retries
        return True
    if _is_wrapper(error) and error.connection_invalidated:
        return True
    driver = driver_error(error)
    if isinstance(driver, psycopg.Error):
        state = sqlstate(driver)
        if state:
            return state[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or state in _UNAVAILABLE_SQLSTATES
        return isinstance(driver, psycopg.OperationalError | psycopg.InterfaceError)
    if _is_wrapper(error):  # a wrapper around something other than psycopg's errors
        return is_sqlalchemy_error(error, "OperationalError", "InterfaceError") or isinstance(driver, OSError)
    return is_sqlalchemy_error(driver, "TimeoutError") or isinstance(driver, TimeoutError | OSError)


def is_data_error(error: BaseException) -> bool:
    """The value written is one PostgreSQL refuses, so writing it again can never succeed:
    SQLSTATE class 22, data exception (22P05 and 22021: a NUL or a character the encoding
    lacks, 22001: too long, 22P02: invalid JSON such as NaN), class 54, program limit
    exceeded (54000: a jsonb value over its 256 MB limit, an index row too large),
    psycopg's own refusal of a NUL in a text parameter (a ``DataError`` without
    SQLSTATE), or text the driver cannot encode (a lone surrogate). The workflow's error
    for that step, not an outage."""
    driver = driver_error(error)
    if isinstance(driver, psycopg.Error):
        state = sqlstate(driver)
        return state[:2] in _DATA_SQLSTATE_CLASSES if state else isinstance(driver, psycopg.DataError)
    if _is_wrapper(error):
        return is_sqlalchemy_error(error, "DataError")
    return isinstance(driver, UnicodeEncodeError)


def may_be_one_callers_fault(error: BaseException) -> bool:
    """For ``GroupCommit.retry_alone``: anything but unavailability may come from one
    caller's rows, so the batch is retried caller by caller."""
    return not is_unavailable(error)
