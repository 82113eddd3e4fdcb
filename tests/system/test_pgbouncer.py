"""Kenning behind pgbouncer in transaction mode, as large deployments run it.

A real pgbouncer (Debian's package) is started in front of the test's PostgreSQL with
fewer server connections than Kenning's processes open, so consecutive transactions of
one client connection run on different server connections: a statement prepared on one
is unknown on the next. Every process finds that out by itself (``--pgbouncer auto``),
prepares nothing, and listens on ``KENNING_DIRECT_DATABASE_URL``, PostgreSQL itself,
since LISTEN through a transaction pooler never hears a NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from kenning.client import Client
from kenning.db import Database, connect, executor_of, statement
from kenning.hosting.executables import find_executable
from tests.ingress_support import cloud_event, start_ingress, structured
from tests.relayer_support import relayer_process, start_receiver
from tests.relayer_support import statuses as outbox_statuses
from tests.support import ProcessPool, check_invariants, eventually, free_port

Sql = psycopg.Connection[tuple[object, ...]]
PGBOUNCER = find_executable("pgbouncer")  # Debian installs it in /usr/sbin
# fewer server connections than the processes' pools hold: transactions move between them
SERVER_CONNECTIONS = 6
ORDERS = 12
ORDERS_ENV = {"ORDERS_COOLING_OFF_SECONDS": "0.2", "ORDERS_PAYMENT_TIMEOUT_SECONDS": "120"}
# Long enough that a flow finishing within the test's waits was woken by a NOTIFY, i.e.
# that LISTEN reached PostgreSQL itself.
NO_POLLING = "600"

pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed (apt-get install pgbouncer)")


@dataclass
class Bouncer:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, database_url: str) -> str:
        """``database_url`` through this pgbouncer."""
        parsed = make_url(database_url)  # a socket directory is in the query (?host=/dir): dropped
        return parsed.set(host="127.0.0.1", port=self.port, query={}).render_as_string(hide_password=False)


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    assert found, out
    return int(found[1]), int(found[2])


def _run_as(server_host: str) -> list[str]:
    """pgbouncer refuses to run as root: as root, run it as the owner of the server's
    socket directory (an embedded server), else as nobody."""
    if os.geteuid() != 0:
        return []
    owner = os.stat(server_host).st_uid if server_host.startswith("/") else 0
    return ["-u", pwd.getpwuid(owner).pw_name if owner else "nobody"]


@contextlib.contextmanager
def pgbouncer(server_url: str) -> Iterator[Bouncer]:
    """pgbouncer in transaction mode in front of ``server_url`` (TCP or a Unix socket)."""
    assert PGBOUNCER is not None
    server = conninfo_to_dict(server_url)
    host = str(server.get("host") or "/var/run/postgresql")
    user, password = str(server.get("user") or "postgres"), str(server.get("password") or "")
    directory = Path(tempfile.mkdtemp(prefix="kenning-pgbouncer-"))
    port = free_port()
    # trust for Kenning's connections; the auth file's password logs pgbouncer in to the server
    (directory / "users.txt").write_text(f'"{user}" "{password}"\n')
    newer = ["max_prepared_statements = 0"] if _version(PGBOUNCER) >= (1, 21) else []  # 1.21+ could track them
    (directory / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={host} port={server.get('port') or 5432}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {directory / 'users.txt'}",
                "pool_mode = transaction",
                f"default_pool_size = {SERVER_CONNECTIONS}",
                "max_client_conn = 1000",
                *newer,
            ]
        )
        + "\n"
    )
    log = directory / "pgbouncer.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [PGBOUNCER, *_run_as(host), str(directory / "pgbouncer.ini")], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 10
        while not re.search(r"listening on 127\.0\.0\.1:\d+", log.read_text(errors="replace")):
            assert process.poll() is None, f"pgbouncer exited: {log.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"pgbouncer did not start: {log.read_text(errors='replace')}"
            time.sleep(0.02)
        yield Bouncer(port, process, log)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def bouncer(pg_server_url: str) -> Iterator[Bouncer]:
    with pgbouncer(pg_server_url) as running:
        yield running


def _pooled(database: Database) -> bool | None:
    return database.behind_pooler  # read afresh: it changes on the first connection


_SERVER_PID = statement("SELECT pg_backend_pid() AS pid")
_REPEATED = statement("SELECT CAST(:n AS int) + 1 AS next")


async def _prepare_then_move(database: Database, direct_url: str) -> None:
    """Run one statement often enough on one connection that psycopg would prepare it,
    then hold that server connection in another client's open transaction, so the next
    transaction of the first client runs on another server connection (pgbouncer hands
    out the most recently used idle one first)."""
    async with database.connection() as conn:
        for n in range(8):
            await conn.execute(_REPEATED, {"n": n})
        first = (await conn.execute(_SERVER_PID)).one().pid
        async with database.transaction() as other:
            held = (await other.execute(_SERVER_PID)).one().pid
            assert held == first, "pgbouncer handed the other client another server connection"
            for n in range(8):
                await conn.execute(_REPEATED, {"n": n})
            assert (await conn.execute(_SERVER_PID)).one().pid != first


async def test_auto_prepares_nothing_behind_pgbouncer_and_off_would_fail(bouncer: Bouncer, database_url: str) -> None:
    pooled = bouncer.url(database_url)
    behind = connect(pooled, pgbouncer="auto", direct_url=database_url)
    try:
        assert _pooled(behind) is None  # not connected yet
        await _prepare_then_move(behind, database_url)
        assert _pooled(behind) is True and behind.listen_url == database_url
        # ctx.session's connections (SQLAlchemy) are told the same, and Kenning's
        # statements inside such a transaction run as often as they like
        async with behind.engine.connect() as session:
            conn = await executor_of(session)
            assert conn.driver.prepare_threshold is None
            for n in range(8):
                await conn.execute(_REPEATED, {"n": n})
            await session.rollback()
    finally:
        await behind.dispose()

    # the same dance with prepared statements left on fails: the test can fail
    wrong = connect(pooled, pgbouncer="off")
    try:
        with pytest.raises(psycopg.errors.InvalidSqlStatementName, match="prepared statement"):
            await _prepare_then_move(wrong, database_url)
    finally:
        await wrong.dispose()

    # straight to PostgreSQL, auto keeps them
    direct = connect(database_url, pgbouncer="auto")
    try:
        async with direct.connection() as conn:
            await conn.execute(_SERVER_PID)
            assert _pooled(direct) is False and conn.driver.prepare_threshold == 5
    finally:
        await direct.dispose()


_SETTING = statement("SELECT current_setting(:name) AS value")


async def test_behind_pgbouncer_each_transaction_bounds_itself(bouncer: Bouncer, database_url: str) -> None:
    """A session setting would stay on a server connection other clients share and be lost
    to this one: behind the pooler the idle and lock bounds are set per transaction."""
    behind = connect(bouncer.url(database_url), pgbouncer="auto", direct_url=database_url)
    try:
        async with behind.connection() as conn:
            idle = (await conn.execute(_SETTING, {"name": "idle_in_transaction_session_timeout"})).one().value
            assert _pooled(behind) is True and idle == "0"  # the server's, untouched
        async with behind.transaction() as conn:
            idle = (await conn.execute(_SETTING, {"name": "idle_in_transaction_session_timeout"})).one().value
            lock = (await conn.execute(_SETTING, {"name": "lock_timeout"})).one().value
            assert (idle, lock) == ("10s", "10s")
    finally:
        await behind.dispose()


def _migrate(processes: ProcessPool, url: str, name: str) -> psutil.Popen:
    return processes.spawn(["migrate"], env={"KENNING_DATABASE_URL": url}, name=name)


@contextlib.asynccontextmanager
async def _client(url: str, direct_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Client]:
    """A Client of an application whose environment names both URLs."""
    monkeypatch.setenv("KENNING_DIRECT_DATABASE_URL", direct_url)
    async with Client(url) as client:
        yield client


def _order(n: int, run: str) -> dict[str, Any]:
    return {"order_id": f"o{n}-{run}", "items": [{"sku": "book", "qty": 1}], "amount": 10 + n}


@pytest.mark.smoke  # a few seconds, and the floors run it against the machine's PostgreSQL
async def test_the_core_flows_run_through_pgbouncer_in_transaction_mode(
    bouncer: Bouncer,
    empty_database_url: str,
    processes: ProcessPool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = empty_database_url
    pooled = bouncer.url(direct)

    # two processes migrate at once through the pooler: one waits for the other's lock
    migrations = [_migrate(processes, pooled, f"migrate-{i}") for i in range(2)]
    assert [m.wait(timeout=60) for m in migrations] == [0, 0], [processes.log_of(m) for m in migrations]

    receiver = await start_receiver(processes)
    # every process on the pooler, LISTEN on PostgreSQL itself; nothing polls in time
    env = {"KENNING_DIRECT_DATABASE_URL": direct, **ORDERS_ENV}
    ingress = start_ingress(processes, pooled, env=ORDERS_ENV)
    started = {
        "ingress": ingress.process,
        "worker": processes.worker(pooled, "kenning.examples.orders", "--poll-interval", NO_POLLING, env=env),
        "scheduler": processes.spawn(
            ["scheduler", "--no-migrate", "--poll-interval", NO_POLLING],
            env={"KENNING_DATABASE_URL": pooled, **env},
            name="scheduler",
        ),
        "relayer": relayer_process(processes, pooled, receiver.url, "--poll-interval", NO_POLLING, env=env),
    }
    run = os.urandom(4).hex()
    async with _client(pooled, direct, monkeypatch) as client, httpx.AsyncClient(timeout=10) as http:
        # starts through the Client; the worker runs each to its wait for the payment
        instances = {
            f"o{n}-{run}": (await client.start("order.created", order=_order(n, run))).instance_id
            for n in range(ORDERS)
        }
        assert client.database.behind_pooler is True

        def requested() -> set[str]:  # the relayer published each order's payment.requested
            return {
                e["data"]["order_id"]
                for e in receiver.events()
                if e.get("attributes", {}).get("type") == "payment.requested"
            }

        await eventually(lambda: requested() >= set(instances), timeout=60, message="payment.requested published")
        # each payment is an event through the ingress: inbox -> the waiting workflow,
        # which then sleeps on a durable timer the scheduler fires
        for order_id in instances:
            event = cloud_event(
                "payment.completed", {"order_id": order_id, "status": "approved"}, source="/pay", id=f"pay-{order_id}"
            )
            headers, body = structured(event)
            response = await http.post(f"{ingress.url}/", headers=headers, content=body)
            assert response.status_code == 202, response.text
        results = await asyncio.gather(*(client.result(i, timeout=60) for i in instances.values()))
        assert results == [{"order_id": o, "tracking": f"trk-{o}"} for o in instances]

    with psycopg.connect(direct, autocommit=True) as sql:
        # the receiver has each event before the relayer marks its row, in a transaction of its own
        await eventually(
            lambda: outbox_statuses(sql) == {"published": ORDERS}, timeout=30, message="every outbox row published"
        )
        timers = sql.execute("SELECT count(*) FROM kenning_history WHERE kind = 'TimerExpired'").fetchone()
        assert timers == (ORDERS,)
        check_invariants(sql)

    assert all(p.is_running() for p in started.values()), "a process exited"
    logs = {name: processes.log_of(p) for name, p in {**started, "migrate": migrations[0]}.items()}
    for name in started:
        assert '"pooler": true' in logs[name] and '"decided": "detected"' in logs[name], (name, logs[name][-2000:])
    everything = "\n".join(logs.values()) + bouncer.log.read_text(errors="replace")
    assert "prepared statement" not in everything
    assert "database.listen_through_pooler" not in everything
