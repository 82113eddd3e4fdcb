"""A database URL as users write it: checked the way libpq reads it, turned into the forms
SQLAlchemy and psycopg take, and redacted for logs and messages.

Pure functions of the text (libpq's own parser, no connection): the SDK's ``App(db_url=)``
checks a URL with them as the database layer does before it connects.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

from kenning.core.urls import hide_credentials
from kenning.errors import ConfigurationError

_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg_async")
_SCHEME_NAME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# what libpq quotes at the end of a parse error: the URL, or the token holding the fault
_QUOTED_TAIL = re.compile(r':\s*"[^"]*"?\s*$')


def _without_scheme(url: str) -> str:
    if not url:
        raise ConfigurationError("no database URL: set KENNING_DATABASE_URL or pass --database-url")
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in _POSTGRES_SCHEMES:
        shown = f"{scheme}://" if _SCHEME_NAME.fullmatch(scheme) else hide_credentials(url)
        raise ConfigurationError(f"database URL must start with postgresql:// (got {shown!r})")
    return url.split("://", 1)[1]


def _check(url: str) -> str:
    """``url`` after its scheme, refused (``ConfigurationError``, its credentials hidden)
    if libpq cannot read it or would misread it. libpq's own errors quote the URL, and a
    password holding a raw ``@`` or ``/`` ends up in the host or the port, then in an
    error line ("failed to resolve host 'ssword@db'")."""
    rest = _without_scheme(url)
    shown = hide_credentials(url, user_is_secret=False)
    try:
        parts = conninfo_to_dict(f"postgresql://{rest}")
    except psycopg.ProgrammingError as error:
        reason = _QUOTED_TAIL.sub("", str(error).strip().splitlines()[0])
        raise ConfigurationError(f"database URL {shown!r} is invalid: {reason}") from None
    if "@" in str(parts.get("host", "")):
        raise ConfigurationError(
            f"database URL {shown!r} is invalid: its host holds an '@' (percent-encode one in the password: %40)"
        )
    if not all(port.isdigit() for port in str(parts.get("port", "")).split(",") if port):
        raise ConfigurationError(
            f"database URL {shown!r} is invalid: its port is not a number (percent-encode a '/' in the password: %2F)"
        )
    return rest


def _hosts_in_query(rest: str) -> str:
    """``rest`` with a list of hosts (libpq's ``h1:p1,h2:p2``) moved from the authority to
    the query as ``host=h1,h2&port=p1,p2``. SQLAlchemy reads one ``host:port`` in the
    authority (a list fails its ``int(port)``); its psycopg dialect hands these two
    parameters to libpq as they are, so ``target_session_attrs`` picks among them as libpq
    would. A URL with one host is left as written."""
    tail_at = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:tail_at], rest[tail_at:]
    userinfo, _, hosts = authority.rpartition("@")
    if "," not in hosts:
        return rest
    parts = conninfo_to_dict(f"postgresql://{rest}")  # libpq's reading: IPv6 brackets off, ports lined up
    path, _, query = tail.partition("?")
    kept = [(key, value) for key, value in parse_qsl(query, keep_blank_values=True) if key not in ("host", "port")]
    ports = str(parts.get("port") or "")
    listed = [("host", str(parts["host"]))] + ([("port", ports)] if ports.strip(",") else [])
    at = f"{userinfo}@" if userinfo else ""
    return f"{at}{path or '/'}?{urlencode(kept + listed, quote_via=quote, safe=',:/')}"


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` as users write it, turned into SQLAlchemy's psycopg 3 dialect."""
    return f"postgresql+psycopg://{_hosts_in_query(_check(url))}"


sync_url = sqlalchemy_url  # the psycopg dialect serves sync and async engines alike


def libpq_url(url: str) -> str:
    """The plain libpq form, for psycopg connections."""
    return f"postgresql://{_check(url)}"


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages (``kenning.core.urls``)."""
    try:
        return hide_credentials(f"postgresql+psycopg://{_without_scheme(url)}", user_is_secret=False)
    except ConfigurationError:
        return "<unparsable database URL>"
