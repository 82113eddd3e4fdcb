"""Connections: URL normalisation and the async engine every process shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from kenning.errors import ConfigurationError
from kenning.rawdb import RawPool

_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg_async")


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
    """The plain libpq form, for raw psycopg connections (LISTEN)."""
    return f"postgresql://{_check(url)}"


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages."""
    try:
        return make_url(sqlalchemy_url(url)).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable database URL>"


@dataclass
class Database:
    """The connections of one process; handed to every component instead of a global.

    ``engine`` (SQLAlchemy) serves transactions: ``ctx.session``, event handlers, anything
    of several statements. ``autocommit`` serves single-statement writes and reads, which
    are most of the traffic: one round trip each (no BEGIN, no COMMIT), on plain psycopg
    connections (``rawdb``: a third of the CPU per statement).
    """

    url: str
    engine: AsyncEngine
    autocommit_pool_size: int = 10
    connect_timeout: int | None = None
    pool_timeout: float = 30.0
    autocommit: RawPool = field(init=False)

    def __post_init__(self) -> None:
        self.autocommit = RawPool(
            libpq_url(self.url),
            self.autocommit_pool_size,
            timeout=self.pool_timeout,
            connect_timeout=self.connect_timeout,
        )

    async def dispose(self) -> None:
        await self.autocommit.dispose()
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
