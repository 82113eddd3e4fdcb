"""Connections: URL normalisation, and the one way Kenning's statements reach PostgreSQL.

Every statement Kenning runs goes through an ``Executor``: a psycopg connection whose rows
are read by name. ``Database`` hands them out from a ``psycopg_pool`` pool of autocommit
connections: a single statement is its own transaction (one round trip, no BEGIN, no
COMMIT), and ``transaction()`` wraps several in BEGIN/COMMIT on the same pool. psycopg
prepares a statement on the server after ``PREPARE_THRESHOLD`` executions, so the hot
statements are parsed and planned once per connection. Plain psycopg costs about 150 µs
of CPU per statement where SQLAlchemy's async engine cost about 550 µs (pool checkout,
greenlet hop, result wrapper); on the worker's hot path that was most of the CPU per
workflow.

SQLAlchemy stays for what users see of it: ``db.engine`` serves ``ctx.session`` and event
handlers' sessions, and ``executor_of`` runs Kenning's statements inside such a
transaction (on the psycopg connection under it). Alembic and the table definitions use
it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection as SqlAlchemyConnection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from kenning.errors import ConfigurationError

_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg_async")

# psycopg's default, stated: a statement run this many times on a connection is prepared
PREPARE_THRESHOLD = 5

# psycopg_pool's warnings (a failed connect, a connection found broken) reach an
# application's logging if it configures any, but never stderr as bare text lines among
# Kenning's JSON: Kenning reports an unreachable database itself.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


def _check(url: str) -> str:
    if not url:
        raise ConfigurationError("no database URL: set KENNING_DATABASE_URL or pass --database-url")
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in _POSTGRES_SCHEMES:
        raise ConfigurationError(
            f"database URL must start with postgresql:// (got {scheme + '://' if scheme else url!r})"
        )
    return url.split("://", 1)[1]


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` as users write it, turned into SQLAlchemy's psycopg 3 dialect."""
    return f"postgresql+psycopg://{_check(url)}"


sync_url = sqlalchemy_url  # the psycopg dialect serves sync and async engines alike


def libpq_url(url: str) -> str:
    """The plain libpq form, for psycopg connections."""
    return f"postgresql://{_check(url)}"


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages."""
    try:
        return make_url(sqlalchemy_url(url)).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable database URL>"


# ------------------------------------------------------------------------ statements

# ``:name`` not preceded by a colon, a word character or a backslash (so ``::type`` and
# ``'12:30'``-like text after a digit stay), as SQLAlchemy's text() reads it
_PARAMETER = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement, written with ``:name`` parameters and kept in psycopg's
    ``%(name)s`` form (``%`` escaped), converted once when the module defining it loads."""

    sql: str

    def __str__(self) -> str:
        return self.sql


def statement(text: str) -> Statement:
    return Statement(_PARAMETER.sub(r"%(\1)s", text.replace("%", "%%")))


# ------------------------------------------------------------------------ executing


class Rows(list[Any]):
    """The rows of one statement (named tuples: read them by name, ``row.id``) and the
    number of rows it touched."""

    __slots__ = ("rowcount",)

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        super().__init__(rows)
        self.rowcount = rowcount

    def first(self) -> Any | None:
        return self[0] if self else None

    def one(self) -> Any:
        if len(self) != 1:
            raise LookupError(f"{len(self)} rows, expected one")
        return self[0]

    def all(self) -> list[Any]:
        return list(self)


_NO_PARAMETERS: Mapping[str, Any] = {}


class Executor:
    """What every storage function takes: one psycopg connection, from the pool (each
    statement autocommits unless inside ``Database.transaction()``) or under a SQLAlchemy
    transaction (``executor_of``). Errors are psycopg's own (``psycopg.errors``)."""

    __slots__ = ("driver",)

    def __init__(self, driver: psycopg.AsyncConnection[Any]) -> None:
        self.driver = driver

    async def execute(self, query: Statement, params: Mapping[str, Any] | None = None) -> Rows:
        cursor = self.driver.cursor(row_factory=namedtuple_row)
        # always a mapping, even empty: psycopg reads ``%%`` as ``%`` only when it has one
        await cursor.execute(query.sql, _NO_PARAMETERS if params is None else params)
        rows = await cursor.fetchall() if cursor.description is not None else []
        return Rows(rows, cursor.rowcount)


async def executor_of(connection: SqlAlchemyConnection) -> Executor:
    """Kenning's statements inside a SQLAlchemy transaction (``ctx.session``, an event
    handler's session): they run on the psycopg connection under it, so they commit or
    roll back with the user's own statements."""
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return Executor(driver)


# ------------------------------------------------------------------------ the pool


@dataclass
class Database:
    """The connections of one process; handed to every component instead of a global.

    ``connection()`` gives an ``Executor`` on a pooled autocommit connection (single
    statements: most of the traffic), ``transaction()`` one inside BEGIN/COMMIT. ``engine``
    (SQLAlchemy) is only for ``ctx.session`` and user handlers.

    The pool opens connections on demand, up to ``autocommit_pool_size``. While the
    server cannot be reached a request fails at once with the connection error (as a
    direct connect would) instead of waiting ``pool_timeout`` seconds for a pool that
    keeps retrying: the ingress answers 503 at once, loops back off; every new request
    tries to connect again, so service resumes as soon as the server is back.
    """

    url: str
    engine: AsyncEngine
    autocommit_pool_size: int = 10
    connect_timeout: int | None = None
    pool_timeout: float = 30.0
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = field(init=False)
    # acquisitions waiting for the pool, each with the slot a failed connect fills
    _waiting: dict[asyncio.Task[Any], list[BaseException]] = field(init=False, default_factory=dict)
    _opened: bool = field(init=False, default=False)
    _closed: bool = field(init=False, default=False)
    # One slot per connection the pool may hold: callers queue here, on a plain future,
    # when every connection is in use. psycopg_pool's own queue costs a task and a timer per
    # waiter on Python 3.11 (asyncio.wait_for): 14 µs of CPU per contended acquisition, a
    # tenth of a statement. Past the gate the pool hands out an idle connection or opens one.
    _slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        watch = self._connect_failed

        class _Connection(psycopg.AsyncConnection[Any]):
            @classmethod
            async def connect(cls, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await super().connect(*args, **kwargs)
                except psycopg.Error as error:
                    watch(error)
                    raise

        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": namedtuple_row,
            "prepare_threshold": PREPARE_THRESHOLD,
        }
        if self.connect_timeout is not None:
            kwargs["connect_timeout"] = self.connect_timeout
        self._slots = asyncio.Semaphore(self.autocommit_pool_size)
        self.pool = AsyncConnectionPool(
            libpq_url(self.url),
            connection_class=_Connection,
            kwargs=kwargs,
            min_size=0,
            max_size=self.autocommit_pool_size,
            timeout=self.pool_timeout,
            # one attempt (and psycopg_pool's one immediate retry) per request that needs a
            # connection, no background retries with growing delays: see the class doc
            reconnect_timeout=0,
            name="kenning",
            open=False,
        )

    def _connect_failed(self, error: BaseException) -> None:
        for task, failure in list(self._waiting.items()):
            if not failure:
                failure.append(error)
                task.cancel()

    async def _admit(self) -> None:
        """Take a slot, waiting at most ``pool_timeout`` for one."""
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
        else:
            try:
                async with asyncio.timeout(self.pool_timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise PoolTimeout(
                    f"no database connection free within {self.pool_timeout} s ({self.autocommit_pool_size} in use)"
                ) from None
        if self._closed:
            self._slots.release()  # wakes the next waiter, to be told the same
            raise PoolClosed("the connection pool is closed")

    async def _getconn(self) -> psycopg.AsyncConnection[Any]:
        if not self._opened:
            self._opened = True
            await self.pool.open()
        await self._admit()
        task = asyncio.current_task()
        assert task is not None
        failure: list[BaseException] = []
        self._waiting[task] = failure
        try:
            return await self.pool.getconn()
        except asyncio.CancelledError:
            self._slots.release()
            if failure and task.uncancel() == 0:  # cancelled by _connect_failed alone
                raise failure[0] from None
            raise
        except BaseException:
            self._slots.release()
            raise
        finally:
            del self._waiting[task]

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Executor]:
        """A pooled connection in autocommit mode: every statement is its own transaction."""
        driver = await self._getconn()
        try:
            yield Executor(driver)
        finally:
            broken = driver.broken
            try:
                await self.pool.putconn(driver)
            finally:
                self._slots.release()
            if broken:
                # A lost server (a restart, a failover) breaks every connection; idle ones
                # would each fail one more statement before being noticed.
                await self.pool.check()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        """Several statements in one transaction (BEGIN … COMMIT, ROLLBACK on an error)."""
        async with self.connection() as conn, conn.driver.transaction():
            yield conn

    async def close_pool(self) -> None:
        """Close the pool; whoever waits for a connection is told so at once."""
        self._closed = True
        self._slots.release()  # a waiter wakes to "closed" and wakes the next
        if self._opened:
            await self.pool.close()

    async def dispose(self) -> None:
        await self.close_pool()
        await self.engine.dispose()


def connect(url: str, *, pool_size: int = 10, max_overflow: int = 10) -> Database:
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=False,
        pool_recycle=1800,
    )
    return Database(url=url, engine=engine, autocommit_pool_size=pool_size + max_overflow)
