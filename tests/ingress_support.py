"""Helpers for the ingress and delivery tests: CloudEvents built with the official SDK, a
real ingress process, and a TCP proxy that can cut the ingress off from PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import psycopg
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from sqlalchemy.engine import make_url

from kenning.hosting.embedded import with_database
from tests.support import ProcessPool, free_port
from tests.tcp_proxy import TcpForwarder

FORMAT = JSONFormat()
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"


def cloud_event(event_type: str, data: Any = None, *, source: str = "tests", **attributes: Any) -> CloudEvent:
    """A CloudEvent 1.0 (the SDK fills in id and time unless given)."""
    return CloudEvent({"type": event_type, "source": source, **attributes}, data)


def binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = ce_http.to_binary(event, FORMAT)
    return message.headers, message.body


def structured(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = ce_http.to_structured(event, FORMAT)
    return message.headers, message.body


def batch(events: list[CloudEvent]) -> tuple[dict[str, str], bytes]:
    """Batched mode: the SDK has no batch writer, so a JSON array of its structured events."""
    body = b"[" + b",".join(FORMAT.write(e) for e in events) + b"]"
    return {"content-type": BATCH_CONTENT_TYPE}, body


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Ingress:
    url: str
    process: psutil.Popen
    token: str = ""

    def headers(self, extra: dict[str, str] | None = None, token: str | None = None) -> dict[str, str]:
        chosen = self.token if token is None else token
        auth = {"authorization": f"Bearer {chosen}"} if chosen else {}
        return {**auth, **(extra or {})}


def wait_until_serving(url: str, process: psutil.Popen, timeout: float = 60.0) -> None:
    """Block until ``GET /healthz`` answers (or fail with the process's exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            raise AssertionError(f"ingress exited with {process.wait(timeout=5)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"ingress at {url} did not answer within {timeout} s")


def spawn_ingress(
    processes: ProcessPool, database_url: str, *extra: str, env: dict[str, str] | None = None, token: str = ""
) -> Ingress:
    """Start ``kenning ingress`` on a free port (without waiting for it)."""
    port = free_port()
    process = processes.spawn(
        ["ingress", "--port", str(port), "--no-migrate", *extra],
        env={
            "KENNING_DATABASE_URL": database_url,
            **({"KENNING_INGRESS_TOKEN": token} if token else {}),
            **(env or {}),
        },
        name="ingress",
    )
    return Ingress(url=f"http://127.0.0.1:{port}", process=process, token=token)


def start_ingress(
    processes: ProcessPool, database_url: str, *extra: str, env: dict[str, str] | None = None, token: str = ""
) -> Ingress:
    """Start ``kenning ingress`` and wait until it serves."""
    ingress = spawn_ingress(processes, database_url, *extra, env=env, token=token)
    wait_until_serving(ingress.url, ingress.process)
    return ingress


def start_ingresses(processes: ProcessPool, database_url: str, *extras: list[str]) -> list[Ingress]:
    """Several ingress processes on one database, started side by side."""
    started = [spawn_ingress(processes, database_url, *extra) for extra in extras]
    for ingress in started:
        wait_until_serving(ingress.url, ingress.process)
    return started


@contextlib.contextmanager
def cloned_database(pg_server_url: str, template: str) -> Iterator[str]:
    """A migrated database of its own, for fixtures wider than one test."""
    name = f"kenning_ingress_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(with_database(pg_server_url, "postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield with_database(pg_server_url, name)
    finally:
        with psycopg.connect(with_database(pg_server_url, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class TcpProxy(TcpForwarder):
    """The way to PostgreSQL, which the test can cut (``tests.tcp_proxy``): ``stop()`` is an
    unreachable database, without touching the shared server.

    The server may listen on TCP or only on a Unix socket (the embedded server does):
    the proxy listens on TCP either way, so the URL it hands out works from any process."""

    def __init__(self, database_url: str) -> None:
        target = make_url(database_url)
        socket_dir = target.query.get("host")
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            self.unix_path: str | None = f"{socket_dir}/.s.PGSQL.{target.port or 5432}"
        else:
            self.unix_path = None
        self.target = (target.host or "127.0.0.1", target.port or 5432)
        super().__init__(self._postgres)
        self.url = (
            target.difference_update_query(["host"])
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    async def _postgres(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.unix_path is not None:
            return await asyncio.open_unix_connection(self.unix_path)
        return await asyncio.open_connection(*self.target)


def inbox_count(sql: psycopg.Connection[tuple[object, ...]]) -> int:
    row = sql.execute("SELECT count(*) FROM kenning_inbox").fetchone()
    assert row is not None
    return int(str(row[0]))
