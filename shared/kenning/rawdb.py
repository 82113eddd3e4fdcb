"""Autocommit statements on plain psycopg connections.

Most of Kenning's writes are one statement that is its own transaction (a fenced step
record, a completion, a claim, an inbox insert). Through SQLAlchemy's async engine each
costs about 550 µs of CPU in the pool checkout, the greenlet hop and the result wrapper,
against about 150 µs for the same statement on a psycopg connection; on the worker's hot
path that difference was most of the CPU per workflow. This module runs the same
``text()`` statements (compiled once to psycopg's ``%(name)s`` form) on a small pool of
psycopg connections in autocommit mode, with results and errors shaped like
SQLAlchemy's, so storage functions take either kind of connection. Transactions
(``ctx.session``, handlers) stay on the SQLAlchemy engine.

psycopg prepares a statement on the server after a few executions (``prepare_threshold``),
so the hot statements are parsed and planned once per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import namedtuple_row
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, NoResultFound
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import TextClause

import kenning.db

_DIALECT = PGDialectAsync_psycopg()  # type: ignore[no-untyped-call]
_COMPILED: dict[int, tuple[TextClause, str]] = {}


def compiled_sql(clause: TextClause) -> str:
    """``clause`` as psycopg runs it (``:name`` becomes ``%(name)s``, ``%`` is escaped)."""
    entry = _COMPILED.get(id(clause))
    if entry is None or entry[0] is not clause:
        entry = (clause, str(clause.compile(dialect=_DIALECT)))
        _COMPILED[id(clause)] = entry  # statements are module constants: the cache stays small
    return entry[1]


class RawResult:
    """The rows of one statement, with the part of SQLAlchemy's ``Result`` API that
    storage functions use. Rows are named tuples: ``row.id`` and ``row[0]`` both work."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def first(self) -> Any | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise (NoResultFound if not self._rows else MultipleResultsFound)(f"{len(self._rows)} rows, expected one")
        return self._rows[0]

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def all(self) -> list[Any]:
        return list(self._rows)

    fetchall = all


class RawConnection:
    """One checked-out psycopg connection in autocommit mode: every ``execute`` is its own
    transaction. psycopg errors are raised as SQLAlchemy's ``DBAPIError`` subclasses
    (``IntegrityError``, ``OperationalError``…), as they would be through the engine."""

    __slots__ = ("driver",)

    def __init__(self, driver: psycopg.AsyncConnection[Any]) -> None:
        self.driver = driver

    async def execute(self, clause: TextClause, params: Mapping[str, Any] | None = None) -> RawResult:
        sql = compiled_sql(clause)
        try:
            cursor = await self.driver.execute(sql, params)
            rows = await cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as error:
            raise DBAPIError.instance(
                sql, params, error, psycopg.Error, connection_invalidated=self.driver.broken
            ) from error
        return RawResult(rows, cursor.rowcount)


Executor = AsyncConnection | RawConnection | kenning.db.Executor
"""What storage functions that run one autocommit statement accept (while they move to
``kenning.db.Executor``)."""


class RawPool:
    """At most ``max_size`` autocommit psycopg connections, opened on demand and kept.

    A connection that comes back broken, closed or not idle (a statement cancelled
    mid-flight) is closed instead of reused. Waiting longer than ``timeout`` for a free
    connection raises SQLAlchemy's pool ``TimeoutError``.
    """

    def __init__(self, url: str, max_size: int, *, timeout: float = 30.0, connect_timeout: int | None = None) -> None:
        self.url = url
        self.max_size = max_size
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._waiters: deque[asyncio.Future[psycopg.AsyncConnection[Any] | None]] = deque()
        self._size = 0
        self._closed = False

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[RawConnection]:
        driver = await self._acquire()
        try:
            yield RawConnection(driver)
        finally:
            self._release(driver)

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        while True:
            if self._closed:
                raise RuntimeError("the connection pool is closed")
            while self._idle:
                driver = self._idle.pop()  # LIFO: the warmest connection, its statements prepared
                if not (driver.closed or driver.broken):
                    return driver
                self._size -= 1
            if self._size < self.max_size:
                self._size += 1
                try:
                    return await self._open()
                except BaseException:
                    self._size -= 1
                    raise
            waiter: asyncio.Future[psycopg.AsyncConnection[Any] | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(self.timeout):
                    handed = await waiter
            except BaseException as error:
                # Cancelled (or timed out) in the same turn as the hand-over: the waiter
                # holds a connection, or the right to open one, that nobody will use.
                if waiter.done() and not waiter.cancelled():
                    unused = waiter.result()
                    if unused is not None:
                        self._release(unused)
                    else:
                        self._hand_over(None)
                if isinstance(error, TimeoutError):
                    raise PoolTimeoutError(
                        f"no database connection free within {self.timeout} s ({self.max_size} in use)"
                    ) from None
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if handed is not None:
                return handed
            # None: a connection was dropped, so there is room to open one; loop

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        extra: dict[str, Any] = {} if self.connect_timeout is None else {"connect_timeout": self.connect_timeout}
        try:
            return await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=namedtuple_row, **extra)
        except psycopg.Error as error:
            raise DBAPIError.instance(None, None, error, psycopg.Error, connection_invalidated=True) from error

    def _release(self, driver: psycopg.AsyncConnection[Any]) -> None:
        reusable = (
            not self._closed
            and not driver.closed
            and not driver.broken
            and driver.info.transaction_status == pq.TransactionStatus.IDLE
        )
        if not reusable:
            self._size -= 1
            self._close_soon(driver)
            if driver.broken:
                # A lost server (a restart, a failover) breaks every connection; idle ones
                # would each fail one more statement before being noticed.
                self._drop_idle()
            self._hand_over(None)
            return
        if not self._hand_over(driver):
            self._idle.append(driver)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        self._size -= len(idle)
        for stale in idle:
            self._close_soon(stale)
        for _ in idle:
            self._hand_over(None)

    def _hand_over(self, driver: psycopg.AsyncConnection[Any] | None) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(driver)
                return True
        return False

    def _close_soon(self, driver: psycopg.AsyncConnection[Any]) -> None:
        if not driver.closed:
            task = asyncio.get_running_loop().create_task(driver.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def dispose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        self._size -= len(idle)
        for driver in idle:
            with contextlib.suppress(psycopg.Error):
                await driver.close()
        while self._hand_over(None):  # every waiter wakes to "the pool is closed"
            pass
