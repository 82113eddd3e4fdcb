"""libpq's multi-host URL (``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``),
the way users reach whichever server is the primary without a movable address: every
process and ``kenning migrate`` connect to the first host that answers as a primary, past a
host that is down and past a standby."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from kenning import Client
from kenning.db import connect
from tests.pg_clusters import Cluster, primary_and_standby
from tests.support import ProcessPool, free_port, kenning_command, workers_started

APP = "tests.apps.core"


@pytest.fixture
def pair() -> Iterator[tuple[Cluster, Cluster]]:
    with primary_and_standby() as (primary, standby):
        with psycopg.connect(primary.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE kenning")
        yield primary, standby


def _down_standby_primary(primary: Cluster, standby: Cluster) -> str:
    """Down first, then the standby, then the primary: libpq must pass two to reach it."""
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{standby.port},127.0.0.1:{primary.port}"
    return f"postgresql://postgres@{hosts}/kenning?target_session_attrs=read-write"


async def test_migrate_and_a_worker_reach_the_primary_of_a_multi_host_url(
    pair: tuple[Cluster, Cluster], processes: ProcessPool
) -> None:
    primary, standby = pair
    url = _down_standby_primary(primary, standby)
    migrated = kenning_command("migrate", url=url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with psycopg.connect(primary.url("kenning"), autocommit=True) as sql:
        assert sql.execute("SELECT count(*) FROM kenning_alembic_version").fetchone() == (1,)
    worker = processes.spawn(
        ["worker", "--app", APP, "--poll-interval", "0.2"], {"KENNING_DATABASE_URL": url}, "worker"
    )
    await workers_started(processes, [worker])
    database = connect(url)
    try:
        async with Client(database=database) as client:
            started = await client.start("three_steps", value=4)
            assert await client.result(started.instance_id, timeout=30) == (4 + 1) * 2 - 3
    finally:
        await database.dispose()
