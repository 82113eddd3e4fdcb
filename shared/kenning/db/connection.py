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
it too. It is imported when first needed, not when this module loads: importing it costs
every process start about 0.4 s of CPU, most of a service's start, and the ingress, the
scheduler, the relayer, the console and a worker whose steps never touch ``ctx.session``
never need it.

Behind pgbouncer in transaction mode (``Database.pgbouncer``) each transaction may run on
a different server connection, so a statement prepared on one is unknown on the next
("prepared statement "_pg3_0" does not exist"): no statement is prepared then, on the pool
or under ``engine``. ``auto`` finds out on the first connection. LISTEN needs a session of
its own on the server, which a transaction pooler never gives: listeners connect to
``listen_url`` (``direct_url``, else ``url``).

Every connection's silence is bounded from both ends (``kenning.db.bounds``): the client's
TCP keepalives and ``tcp_user_timeout`` on all of them, and on the pool's sessions, which
run Kenning's statements only, the server's idle-in-transaction, lock and statement
timeouts and TCP keepalives, set once per connection. Behind a pooler a session setting
would stay on a server connection other clients share and be lost to this one: each
transaction sets its bounds with ``SET LOCAL`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import psycopg
import structlog
from psycopg.pq import TransactionStatus
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from kenning.core.database_urls import libpq_url, redacted, sqlalchemy_url
from kenning.core.names import env_name
from kenning.db.bounds import SessionBounds
from kenning.db.pool import AsyncPool
from kenning.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import AdaptedConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SqlAlchemyConnection
    from sqlalchemy.ext.asyncio import AsyncEngine


PGBOUNCER_MODES = ("auto", "on", "off")  # kenning.db.Database.pgbouncer

# psycopg's default, stated: a statement run this many times on a connection is prepared
PREPARE_THRESHOLD = 5
SESSION_CONNECT_TIMEOUT = 10  # seconds: Database.session's connect, when no connect_timeout is set

# psycopg_pool's warnings (a failed connect, a connection found broken) reach an
# application's logging if it configures any, but never stderr as bare text lines among
# Kenning's JSON: Kenning reports an unreachable database itself.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

_log = structlog.get_logger("kenning.db")


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
    (SQLAlchemy, built on first use with the ``engine_*`` sizes) is only for
    ``ctx.session`` and user handlers.

    The pool opens connections on demand, up to ``autocommit_pool_size``. While the
    server cannot be reached a request fails at once with the connection error (as a
    direct connect would) instead of waiting ``pool_timeout`` seconds for a pool that
    keeps retrying: the ingress answers 503 at once, loops back off; every new request
    tries to connect again, so service resumes as soon as the server is back.

    ``pgbouncer``: ``on`` when ``url`` leads to a transaction-mode pooler, ``off`` when
    straight to PostgreSQL, ``auto`` to compare, on the first connection, the backend
    process ID the server reports with the one given at connect time (a pooler hands out
    a key of its own); the first connection logs what was decided (``database.mode``).
    """

    url: str
    autocommit_pool_size: int = 10
    engine_pool_size: int = 5
    engine_max_overflow: int = 10
    engine_pool_timeout: float = 30.0
    connect_timeout: int | None = None
    pool_timeout: float = 30.0
    pgbouncer: str = "auto"
    # a session on the server itself, for LISTEN; "" means ``url``
    direct_url: str = ""
    bounds: SessionBounds = field(default_factory=SessionBounds)
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
    # behind a transaction pooler? None until the first connection tells (pgbouncer=auto)
    _pooled: bool | None = field(init=False, default=None)
    _announced: bool = field(init=False, default=False)
    _listens: bool = field(init=False, default=False)
    _warned: bool = field(init=False, default=False)
    _deciding: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        if self.pgbouncer not in PGBOUNCER_MODES:
            raise ConfigurationError(f"pgbouncer must be one of {', '.join(PGBOUNCER_MODES)} (got {self.pgbouncer!r})")
        if self.pgbouncer != "auto":
            self._pooled = self.pgbouncer == "on"
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
            "prepare_threshold": None if self._pooled else PREPARE_THRESHOLD,
        }
        if self.connect_timeout is not None:
            kwargs["connect_timeout"] = self.connect_timeout
        kwargs.update(self.client_parameters)
        self._slots = asyncio.Semaphore(self.autocommit_pool_size)
        self.pool = AsyncPool(  # its upkeep tasks end when cancelled (kenning/db/pool.py)
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
            configure=self._configure,
        )

    @cached_property
    def engine(self) -> AsyncEngine:
        """SQLAlchemy's engine, for ``ctx.session`` and user handlers; built (and SQLAlchemy
        imported) on first use. Its connections open only when a session needs one."""
        from sqlalchemy import event
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(
            sqlalchemy_url(self.url),
            pool_size=self.engine_pool_size,
            max_overflow=self.engine_max_overflow,
            pool_timeout=self.engine_pool_timeout,
            pool_pre_ping=False,
            pool_recycle=1800,
            connect_args=self.client_parameters,
        )
        # ctx.session's connections: the same decision, on the psycopg connection under each
        event.listen(engine.sync_engine, "connect", self._configure_engine_connection)
        return engine

    @property
    def client_parameters(self) -> dict[str, Any]:
        """libpq's parameters that bound a connection's silence at the client's end: for
        every connection to this database, listeners' included."""
        return self.bounds.client_parameters()

    @property
    def listen_url(self) -> str:
        """Where listeners connect: a session of their own on the server. (Asking is
        listening: one warning if that goes through a pooler.)"""
        self._listens = True
        self._warn_if_listening_through_pooler()
        return self.direct_url or self.url

    @property
    def behind_pooler(self) -> bool | None:
        """Whether ``url`` leads to a pooler (nothing is prepared then); None while
        ``auto`` has not connected yet."""
        return self._pooled

    def _warn_if_listening_through_pooler(self) -> None:
        if self._listens and self._pooled and not self.direct_url and not self._warned:
            self._warned = True
            _log.warning(
                "database.listen_through_pooler",
                hint="LISTEN through a pooler in transaction mode never hears a NOTIFY (only the fallback poll "
                "wakes this process): set KENNING_DIRECT_DATABASE_URL to PostgreSQL itself",
            )

    async def _configure(self, driver: psycopg.AsyncConnection[Any]) -> None:
        """Every new connection of the pool: no prepared statements behind a pooler
        (under ``auto`` the first one finds out, one round trip), and straight to
        PostgreSQL the server's end of its bounds (one round trip)."""
        await self._configure_any(driver)
        if not self._pooled:
            await self._apply(driver, self.bounds.own_session())

    async def _configure_any(self, driver: psycopg.AsyncConnection[Any]) -> None:
        if self._pooled is None or not self._announced:
            await self._decide(driver)
        if self._pooled:
            driver.prepare_threshold = None

    async def _configure_engine(self, driver: psycopg.AsyncConnection[Any]) -> None:
        """Every new connection of the engine (``ctx.session``, handlers' sessions): the
        server's TCP keepalives only, as its transactions run user code (see
        ``bound_transaction``)."""
        await self._configure_any(driver)
        if not self._pooled:
            await self._apply(driver, self.bounds.server_tcp())
            await driver.commit()  # the engine's connections are not autocommit

    async def _apply(self, driver: psycopg.AsyncConnection[Any], settings: Mapping[str, str]) -> None:
        from kenning.storage.server import settings_apply  # storage modules import this one

        await settings_apply(Executor(driver), settings, local=False)

    def _configure_engine_connection(self, dbapi_connection: Any, _record: Any) -> None:
        # SQLAlchemy's connect event is synchronous; run_async awaits in its greenlet
        cast("AdaptedConnection", dbapi_connection).run_async(self._configure_engine)

    async def bound_transaction(self, conn: Executor) -> None:
        """From here to the end of the current transaction only Kenning's statements run
        (an activity's step record and commit, a delivery after its handlers): bound its
        idle time and lock waits as on the pool's own sessions (``SET LOCAL``)."""
        from kenning.storage.server import settings_apply

        await settings_apply(conn, self.bounds.transaction(), local=True)

    async def unbound_transaction(self, conn: Executor) -> None:
        """User code runs next inside the current transaction on one of the pool's
        sessions (an ``on_event`` handler): no idle bound until ``bound_transaction``."""
        from kenning.storage.server import settings_apply

        if self.bounds.idle_in_transaction > 0:
            await settings_apply(conn, {"idle_in_transaction_session_timeout": "0"}, local=True)

    async def _decide(self, driver: psycopg.AsyncConnection[Any]) -> None:
        from kenning.storage.server import server_backend_pid  # storage modules import this one

        async with self._deciding:
            if self._announced:
                return
            how = "configured"
            if self._pooled is None:
                pid = await server_backend_pid(Executor(driver))
                if driver.info.transaction_status != TransactionStatus.IDLE:
                    await driver.rollback()  # the engine's connections are not autocommit
                self._pooled = pid != driver.info.backend_pid
                how = "detected"
            self._announced = True
            # at info only behind a pooler: straight to PostgreSQL nothing differs from before
            report = _log.info if self._pooled else _log.debug
            report(
                "database.mode",
                pgbouncer=self.pgbouncer,
                pooler=self._pooled,
                decided=how,
                prepared_statements=not self._pooled,
                direct_url=redacted(self.direct_url) if self.direct_url else None,
            )
            self._warn_if_listening_through_pooler()

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
        cancels_before = task.cancelling()
        self._waiting[task] = failure
        try:
            driver = await self.pool.getconn()
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
        # getconn returned, though a cancel may have reached this task while it waited:
        # Python 3.11's asyncio.wait_for (psycopg_pool's wait for a hand-over) swallows a
        # cancellation that arrives once the connection is already this task's. The cancel
        # was consumed in there (the task was suspended in getconn throughout, so nothing of
        # it is pending), but it is still counted.
        if failure:
            # _connect_failed's: left counted, the next failure's uncancel() would not reach
            # 0 and a bare CancelledError would escape into the caller's loop instead of the
            # connect error (and a TaskGroup or timeout would misread the count)
            task.uncancel()
        if task.cancelling() > cancels_before:
            # someone else's (a shutdown's): honoured here, or the task would run on with the
            # connection as if never cancelled, and a shutdown wait for it to its grace period
            try:
                await self.pool.putconn(driver)
            finally:
                self._slots.release()
            raise asyncio.CancelledError
        return driver

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
                # would each fail one more statement before being noticed. They are closed,
                # not probed: a probe has no timeout (on a half-open network it blocks this
                # caller for a TCP timeout per connection) and psycopg_pool's check()
                # swallows the caller's cancellation. Needed ones are opened again on demand.
                await self.pool.drain()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Executor]:
        """A connection of its own, outside the pool, in autocommit mode: for a task that
        must not queue behind the pool's users (``kenning.hosting.commitwatch``). Nothing
        is prepared on it (it may lead to a pooler); connecting is bounded even where the
        pool's connects are not."""
        driver = await psycopg.AsyncConnection.connect(
            libpq_url(self.url),
            autocommit=True,
            row_factory=namedtuple_row,
            prepare_threshold=None,
            connect_timeout=self.connect_timeout or SESSION_CONNECT_TIMEOUT,
        )
        try:
            yield Executor(driver)
        finally:
            await driver.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        """Several statements in one transaction (BEGIN … COMMIT, ROLLBACK on an error)."""
        async with self.connection() as conn, conn.driver.transaction():
            if self._pooled:  # a session setting would not be this connection's next time
                await self.bound_transaction(conn)
            yield conn

    async def close_pool(self) -> None:
        """Close the pool; whoever waits for a connection is told so at once."""
        self._closed = True
        self._slots.release()  # a waiter wakes to "closed" and wakes the next
        if self._opened:
            await self.pool.close()

    async def dispose(self) -> None:
        await self.close_pool()
        if "engine" in self.__dict__:  # built: a cached_property keeps it there
            await self.engine.dispose()


def connect(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    pgbouncer: str | None = None,
    direct_url: str | None = None,
    bounds: SessionBounds | None = None,
) -> Database:
    """The connections of a process. ``pgbouncer`` and ``direct_url`` not given (a
    ``Client`` in an application) come from ``KENNING_PGBOUNCER`` and
    ``KENNING_DIRECT_DATABASE_URL`` (``kenning.hosting.config.ProcessSettings``), and
    ``bounds`` from their ``KENNING_DATABASE_*_TIMEOUT`` variables."""
    return Database(
        url=url,
        autocommit_pool_size=pool_size + max_overflow,
        engine_pool_size=pool_size,
        engine_max_overflow=max_overflow,
        pgbouncer=os.environ.get(env_name("--pgbouncer"), "auto") if pgbouncer is None else pgbouncer,
        direct_url=os.environ.get(env_name("--direct-database-url"), "") if direct_url is None else direct_url,
        bounds=SessionBounds.from_environment() if bounds is None else bounds,
    )
