"""A database that is away, as a client's caller meets it: the client retries a call that
a retry cannot do twice (a read, a cancel, a message or request whose id was fixed before
the first attempt) with tenacity's back-off for up to ``retry_seconds``, and then, or at
once for a call it must not repeat, raises ``DatabaseUnavailableError``, a
``KenningError`` saying to try again, never psycopg's own exception.

Unavailable is ``kenning.db.errors.is_unavailable``: a lost or refused connection, a server
shutting down (``AdminShutdown``), no free connection, a serialization failure. A closed
pool is the caller's (``Client.close`` ran), not the database's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
import tenacity
from psycopg_pool import PoolClosed

from kenning.db import errors as dberrors
from kenning.errors import DatabaseUnavailableError

_log = structlog.get_logger("kenning.client")

T = TypeVar("T")

# seconds a client goes on retrying a call that is safe to repeat: a restart or a failover
# takes a few; beyond that the caller decides
DEFAULT_RETRY_SECONDS = 30.0
# the kenning command's: an operator at a prompt hears of a wrong or stopped database sooner
COMMAND_RETRY_SECONDS = 5.0
_FIRST_WAIT = 0.05  # seconds before the first retry, doubling (with jitter) up to _LONGEST_WAIT
_LONGEST_WAIT = 1.0


def is_unavailable(error: BaseException) -> bool:
    return dberrors.is_unavailable(error) and not isinstance(dberrors.driver_error(error), PoolClosed)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


async def retried(call: Callable[[], Awaitable[T]], what: str, *, retry_seconds: float, again: str = "") -> T:
    """``call()``, run again while the database is unavailable, for at most
    ``retry_seconds`` (0: once); then ``DatabaseUnavailableError`` naming ``what`` and the
    cause, with ``again`` (how to retry safely) after "try again"."""

    def retrying(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        # at debug: the caller hears of it once, by the error, if the retries do not help
        _log.debug(
            "client.database_unavailable",
            call=what,
            attempt=state.attempt_number,
            error=_first_line(error) if error is not None else "",
        )

    attempts = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(is_unavailable),
        wait=tenacity.wait_exponential_jitter(multiplier=_FIRST_WAIT, max=_LONGEST_WAIT, jitter=_FIRST_WAIT),
        stop=tenacity.stop_after_delay(retry_seconds),
        before_sleep=retrying,
        reraise=True,
    )
    try:
        async for attempt in attempts:  # (not attempts(call): tenacity awaits no lambda's coroutine)
            with attempt:
                return await call()
    except Exception as error:
        if not is_unavailable(error):
            raise
        tried = f" (retried for {retry_seconds:.3g} s)" if retry_seconds > 0 else ""
        raise DatabaseUnavailableError(
            f"{what}: the database is unavailable{tried}: {_first_line(error)}; try again{again}"
        ) from error
    raise AssertionError("tenacity stopped without an outcome")  # reraise=True: never reached
