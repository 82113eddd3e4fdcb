"""Helpers for the outbox and relayer tests: the receiver process, relayers in and out of
process, inserting events, reading what arrived, and the outbox invariant checker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from kenning.db import Database
from kenning.storage import outbox as outbox_sql
from kenning_relayer import Relayer, RelayerSettings
from tests.support import REPO_ROOT, ProcessPool, eventually, free_port, run_kenning

# Relayer options for tests: millisecond back-offs and a short fallback poll.
FAST_RELAYER = (
    "--no-migrate",
    "--poll-interval",
    "0.2",
    "--retry-initial-seconds",
    "0.02",
    "--retry-max-seconds",
    "0.1",
)


@dataclass
class Receiver:
    url: str
    port: int
    record: Path
    proc: psutil.Popen

    def events(self) -> list[dict[str, Any]]:
        """Every request received so far, in arrival order."""
        text = self.record.read_text() if self.record.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def arrivals(self) -> Counter[str]:
        """How many requests arrived per CloudEvents id."""
        return Counter(e["attributes"]["id"] for e in self.events() if "attributes" in e)

    def accepted(self) -> Counter[str]:
        """How many requests per id were answered 2xx."""
        return Counter(e["attributes"]["id"] for e in self.events() if e.get("answer") in (200, "hold"))


async def start_receiver(pool: ProcessPool, *options: str, port: int | None = None) -> Receiver:
    """A receiver process on a free port, ready to answer."""
    port = port or free_port()
    record = Path(pool.log_dir) / f"received-{port}.jsonl"
    log_path = Path(pool.log_dir) / f"receiver-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "wb") as log:
        proc = psutil.Popen(
            [sys.executable, "-m", "tests.receiver", "--port", str(port), "--record", str(record), *options],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pool.procs.append((proc, log_path))
    url = f"http://127.0.0.1:{port}/events"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"receiver exited: {log_path.read_text()}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    await eventually(ready, timeout=20, interval=0.05, message="receiver ready")
    return Receiver(url=url, port=port, record=record, proc=proc)


def relayer_process(
    pool: ProcessPool, database_url: str, broker_url: str, *extra: str, env: dict[str, str] | None = None
) -> psutil.Popen:
    return pool.spawn(
        ["relayer", "--broker-url", broker_url, *FAST_RELAYER, *extra],
        env={"KENNING_DATABASE_URL": database_url, **(env or {})},
        name="relayer",
    )


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


def kenning_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """Run ``python -m kenning ARGS`` to completion, stdout and stderr kept apart."""
    done = run_kenning(args, {**os.environ, **(env or {})})
    return CliResult(done.returncode, done.stdout, done.stderr)


@contextlib.asynccontextmanager
async def running_relayer(database: Database, broker_url: str, **settings: Any) -> AsyncIterator[Relayer]:
    """An in-process relayer on this event loop, for tests that need no process boundary."""
    options: dict[str, Any] = {
        "poll_interval": 0.2,
        "retry_initial_seconds": 0.02,
        "retry_max_seconds": 0.1,
        "lease_seconds": 5.0,
        "shutdown_grace_seconds": 1.0,
        **settings,
    }
    relayer = Relayer(database, RelayerSettings(broker_url=broker_url, **options))
    task = asyncio.create_task(relayer.run())
    try:
        yield relayer
    finally:
        relayer.stop()
        await asyncio.wait_for(task, timeout=15)


async def insert_events(
    database: Database,
    count: int,
    *,
    event_type: str = "test.event",
    instance_id: str | None = None,
    data: Any = None,
    source: str = "/tests",
) -> list[str]:
    """Insert ``count`` pending events in one transaction; returns their ids in order."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    async with database.transaction() as conn:
        for n, event_id in enumerate(ids):
            await outbox_sql.outbox_insert(
                conn,
                event_id=event_id,
                instance_id=instance_id,
                event_type=event_type,
                source=source,
                data_json=json.dumps(data if data is not None else {"n": n}),
                content_type="application/json",
            )
    return ids


def statuses(sql: psycopg.Connection[tuple[object, ...]]) -> Counter[str]:
    return Counter(str(r[0]) for r in sql.execute("SELECT status FROM kenning_outbox").fetchall())


def outbox_row(sql: psycopg.Connection[tuple[object, ...]], event_id: str) -> dict[str, Any]:
    cursor = sql.execute(
        "SELECT status, attempts, last_error, lease_owner, CAST(lease_token AS text) AS lease_token, available_at, "
        "published_at, last_attempt_at, created_at FROM kenning_outbox WHERE id = %s",
        (event_id,),
    )
    row = cursor.fetchone()
    assert row is not None, f"no outbox row {event_id}"
    names = [d.name for d in cursor.description or []]
    return dict(zip(names, row, strict=True))


def check_outbox_invariants(sql: psycopg.Connection[tuple[object, ...]]) -> None:
    """The SQL invariant checker run after every relayer test."""
    leaseless = sql.execute(
        "SELECT id FROM kenning_outbox WHERE status = 'publishing' AND lease_token IS NULL"
    ).fetchall()
    assert leaseless == [], f"publishing without a lease: {leaseless}"
    leased = sql.execute(
        "SELECT id FROM kenning_outbox WHERE status <> 'publishing' AND lease_token IS NOT NULL"
    ).fetchall()
    assert leased == [], f"finished or pending but still leased: {leased}"
    unstamped = sql.execute(
        "SELECT id FROM kenning_outbox WHERE (status = 'published') <> (published_at IS NOT NULL)"
    ).fetchall()
    assert unstamped == [], f"published_at does not match the status: {unstamped}"
    unexplained = sql.execute(
        "SELECT id FROM kenning_outbox WHERE status = 'failed' AND (last_error IS NULL OR attempts < 1)"
    ).fetchall()
    assert unexplained == [], f"dead letters without an error: {unexplained}"


def ids_in_arrival_order(receiver: Receiver, accepted_only: bool = True) -> list[str]:
    return [
        e["attributes"]["id"]
        for e in receiver.events()
        if "attributes" in e and (not accepted_only or e.get("answer") in (200, "hold"))
    ]


def arrival_times(receiver: Receiver, event_id: str) -> Sequence[float]:
    return [float(e["at"]) for e in receiver.events() if e.get("attributes", {}).get("id") == event_id]
