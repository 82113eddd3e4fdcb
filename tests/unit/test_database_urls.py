"""A database URL naming several hosts, as libpq reads it (``h1:p1,h2:p2``), reaches
SQLAlchemy (migrations, ``ctx.session``) as the same list of hosts and ports."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from kenning.core.database_urls import libpq_url, sqlalchemy_url


def _connect_args(url: str) -> dict[str, object]:
    """What SQLAlchemy's psycopg dialect hands to psycopg for ``url``."""
    dialect = PGDialect_psycopg()  # type: ignore[no-untyped-call]
    _, params = dialect.create_connect_args(make_url(sqlalchemy_url(url)))  # type: ignore[no-untyped-call]
    return dict(params)


@pytest.mark.parametrize(
    ("url", "hosts", "ports"),
    [
        ("postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write", "h1,h2", "5432,5433"),
        (
            "postgresql://u:p%40ss@10.0.0.1:6000,10.0.0.2:6001,10.0.0.3:6002/db",
            "10.0.0.1,10.0.0.2,10.0.0.3",
            "6000,6001,6002",
        ),
        ("postgresql://u@h1,h2/db", "h1,h2", ","),  # empty ports: the default, as libpq reads ","
        ("postgresql://u@[::1]:5432,h2:5433/db", "::1,h2", "5432,5433"),
    ],
)
def test_a_multi_host_url_reaches_sqlalchemy_as_libpq_reads_it(url: str, hosts: str, ports: str | None) -> None:
    args = _connect_args(url)
    assert args["host"] == hosts
    assert args.get("port") == ports
    assert args["dbname"] == "db"
    assert args["user"] == "u"
    libpq = conninfo_to_dict(libpq_url(url))
    assert {k: v for k, v in args.items() if k in libpq} == {k: libpq[k] for k in args if k in libpq}


def test_the_other_parameters_of_a_multi_host_url_stay() -> None:
    args = _connect_args("postgresql://u:secret@h1:1,h2:2/db?target_session_attrs=read-write&sslmode=verify-full")
    assert args["target_session_attrs"] == "read-write"
    assert args["sslmode"] == "verify-full"
    assert args["password"] == "secret"


def test_a_single_host_url_is_left_as_written() -> None:
    url = "postgresql://u:p@db.example:5432/db?sslmode=require"
    assert sqlalchemy_url(url) == "postgresql+psycopg://u:p@db.example:5432/db?sslmode=require"


def test_a_host_without_a_port_in_a_list_keeps_its_place() -> None:
    args = _connect_args("postgresql://u@h1:6000,h2/db")
    assert (args["host"], args["port"]) == ("h1,h2", "6000,")
