"""Which database errors mean "the database is away" (try again later) rather than "this
write is wrong": the ingress answers the first with 503, and group commit retries a
failed batch caller by caller only for the second. Among the second, a data exception
means the value itself can never be stored: the replay engine makes it the step's error."""

from __future__ import annotations

from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

# connection exception, insufficient resources, operator intervention, rollback
# (serialization failure, deadlock): none says anything about the data written
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "40")


def is_unavailable(error: BaseException) -> bool:
    """By SQLSTATE class, not by exception type: psycopg raises ``OperationalError`` for
    program limits (54: an index row too large) and object states (55) too, which are one
    write's fault. Without a SQLSTATE, an operational or interface error is the
    connection's."""
    if isinstance(error, DBAPIError):
        if error.connection_invalidated:
            return True
        sqlstate = str(getattr(error.orig, "sqlstate", "") or "")
        if sqlstate:
            return sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES
        return isinstance(error, OperationalError | InterfaceError)
    return isinstance(error, PoolTimeoutError | TimeoutError | OSError)


def is_data_error(error: BaseException) -> bool:
    """The value written is one PostgreSQL refuses, so writing it again can never succeed:
    SQLSTATE class 22, data exception (22P05 and 22021: a NUL or a character the encoding
    lacks, 22001: too long, 22P02: invalid JSON such as NaN), psycopg's own refusal of a
    NUL in a text parameter (a ``DataError`` without SQLSTATE), or text the driver cannot
    encode (a lone surrogate). The workflow's error for that step, not an outage."""
    if isinstance(error, DBAPIError):
        sqlstate = str(getattr(error.orig, "sqlstate", "") or "")
        return sqlstate[:2] == "22" if sqlstate else isinstance(error, DataError)
    return isinstance(error, UnicodeEncodeError)


def may_be_one_callers_fault(error: BaseException) -> bool:
    """For ``GroupCommit.retry_alone``: anything but unavailability may come from one
    caller's rows, so the batch is retried caller by caller."""
    return not is_unavailable(error)
