"""Connections: URL normalisation and the async engine every process shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from kenning.errors import ConfigurationError

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
    """One async engine; processes hand it to every component instead of a global."""

    url: str
    engine: AsyncEngine
    # The same pool in autocommit mode: a single-statement write is one round trip (no
    # BEGIN, no COMMIT) and still its own transaction.
    autocommit: AsyncEngine = field(init=False)

    def __post_init__(self) -> None:
        self.autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")

    async def dispose(self) -> None:
        await self.engine.dispose()


def connect(url: str, *, pool_size: int = 10, max_overflow: int = 10) -> Database:
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=False,
        pool_recycle=1800,
    )
    return Database(url=url, engine=engine)
