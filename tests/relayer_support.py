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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg

from kenning.db import Database
from kenning.storage import outbox as outbox_sql
from kenning.storage.outbox import OutboxOutcome, OutboxRow
from kenning_relayer import Relayer, RelayerSettings
from kenning_relayer.targets import Target
from tests.brokers import TcpProxy
from tests.support import REPO_ROOT, ProcessPool, eventually, free_port, run_kenning, until_answering

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

    await until_answering(f"http://127.0.0.1:{port}/health", proc, "the receiver", log_path=log_path)
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


async def insert_varied_events(database: Database, instance_id: str = "i-ordered") -> dict[str, str]:
    """Events of every payload kind (JSON with typed extensions, bytes, text) and three of
    one instance in creation order; returns their ids by name: json, blob, text, first,
    second, third."""
    ids = {name: str(uuid.uuid4()) for name in ("json", "blob", "text", "first", "second", "third")}
    async with database.transaction() as conn:
        await outbox_sql.outbox_insert(
            conn,
            event_id=ids["json"],
            instance_id="i-json",
            event_type="order.placed",
            source="/shop/orders",
            subject="o-9",
            content_type="application/json",
            data_json=json.dumps({"order_id": "o-9", "total": 42}),
            extensions={"urgent": True, "priority": 5, "tenant": "acme"},
        )
        await outbox_sql.outbox_insert(
            conn, event_id=ids["blob"], instance_id="i-blob", event_type="blob.made", source="/b", data_bytes=b"\xff"
        )
        await outbox_sql.outbox_insert(
            conn,
            event_id=ids["text"],
            instance_id="i-text",
            event_type="note.made",
            source="/n",
            content_type="text/plain",
            data_json=json.dumps("thank you"),
        )
        for n, name in enumerate(("first", "second", "third")):
            await outbox_sql.outbox_insert(
                conn,
                event_id=ids[name],
                instance_id=instance_id,
                event_type="step.done",
                source="/steps",
                content_type="application/json",
                data_json=json.dumps({"n": n}),
            )
    return ids


def sample_row(event_type: str = "order.placed", attempts: int = 1) -> OutboxRow:
    """An outbox row as a claim returns it, built in memory: for one target's deliver()."""
    now = datetime.now(UTC)
    return OutboxRow(
        id=str(uuid.uuid4()),
        instance_id=None,
        event_type=event_type,
        source="/tests",
        subject=None,
        content_type="application/json",
        data={"n": 1},
        data_bytes=None,
        extensions={},
        status="publishing",
        attempts=attempts,
        available_at=now,
        lease_owner="test",
        last_error=None,
        last_attempt_at=now,
        created_seq=1,
        created_at=now,
        published_at=None,
    )


async def insert_awkward_event(database: Database) -> str:
    """One event whose attributes a header cannot carry as they are (a space, '%',
    non-ASCII, a '%41' that must stay as it is, a media type with parameters); its id."""
    event_id = str(uuid.uuid4())
    async with database.transaction() as conn:
        await outbox_sql.outbox_insert(
            conn,
            event_id=event_id,
            instance_id=None,
            event_type="order.placed",
            source="/a b",
            subject="50% café",
            content_type="application/json; charset=utf-8",
            data_json=json.dumps({"note": "déjà a%41b"}),
            extensions={"label": 'a%41b "quoted"', "region": "zürich"},
        )
    return event_id


def awkward_event_in_the_inbox(sql: psycopg.Connection[tuple[object, ...]], event_id: str) -> dict[str, Any] | None:
    """The inbox row (source, type, attributes, data) of ``insert_awkward_event``'s event,
    ``time`` checked against the outbox row's creation and left out; None until it arrives."""
    row = sql.execute(
        "SELECT source, event_type, attributes, data FROM kenning_inbox WHERE event_id = %s", (event_id,)
    ).fetchone()
    if row is None:
        return None
    attributes = dict(row[2])  # type: ignore[call-overload]
    created = outbox_row(sql, event_id)["created_at"]
    assert datetime.fromisoformat(str(attributes.pop("time"))) == created
    return {"source": row[0], "type": row[1], "attributes": attributes, "data": row[3]}


def awkward_event_expected(event_id: str) -> dict[str, Any]:
    return {
        "source": "/a b",
        "type": "order.placed",
        "attributes": {
            "id": event_id,
            "source": "/a b",
            "type": "order.placed",
            "specversion": "1.0",
            "subject": "50% café",
            "datacontenttype": "application/json; charset=utf-8",
            "label": 'a%41b "quoted"',
            "region": "zürich",
        },
        "data": {"note": "déjà a%41b"},
    }


# ------------------------------------------------------------------ what the broker tests share


@contextlib.asynccontextmanager
async def relaying(
    mode: str, processes: ProcessPool, database: Database, database_url: str, broker_url: str, *extra: str
) -> AsyncIterator[None]:
    """A relayer in ``mode``: binary mode as a process (the whole path), structured mode
    in this process (cheaper: only the encoding differs)."""
    if mode == "binary":
        relayer_process(processes, database_url, broker_url, *extra)
        yield
    else:
        async with running_relayer(database, broker_url, content_mode=mode):
            yield


def placed_attributes(event_id: str, *, binary: bool) -> dict[str, Any]:
    """The CloudEvent attributes (``time`` left out) of ``insert_varied_events``' "json"
    event and of tests.apps.outbox's order.placed: binary mode carries the extensions as
    header strings, JSON (structured mode) keeps their types."""
    return {
        "id": event_id,
        "source": "/shop/orders",
        "type": "order.placed",
        "specversion": "1.0",
        "subject": "o-9",
        "datacontenttype": "application/json",
        "tenant": "acme",
        "priority": "5" if binary else 5,
        "urgent": "true" if binary else True,
    }


def ce_headers(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes as a binary-mode message's ``ce-`` headers."""
    return {f"ce-{name}": value for name, value in attributes.items()}


def retried_as_unreachable(sql: psycopg.Connection[tuple[object, ...]], ids: Sequence[str]) -> bool:
    """Every row attempted at least twice, its last error the broker unreachable."""
    rows = [outbox_row(sql, event_id) for event_id in ids]
    return all(row["attempts"] >= 2 and "broker unreachable" in str(row["last_error"]) for row in rows)


async def published_across_a_cut(
    network: TcpProxy, database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> list[str]:
    """Cut the network to the broker, insert 5 events, wait for an attempt to fail as
    unreachable, bring the network back: every outbox row gets published. The new ids."""
    await network.stop()
    ids = await insert_events(database, 5)
    await eventually(
        lambda: "broker unreachable" in str(outbox_row(sql, ids[-1])["last_error"]), timeout=30, message="cut"
    )
    await network.start()
    total = sum(statuses(sql).values())
    await eventually(lambda: statuses(sql) == {"published": total}, timeout=30, message="published after the cut")
    return ids


async def delivered_once(target: Target) -> OutboxOutcome:
    """One ``sample_row`` through ``target`` in this process (no database), then closed."""
    try:
        return await target.deliver(sample_row())
    finally:
        await target.close()


def relayer_without(module: str, broker_url: str, tmp_path: Path) -> CliResult:
    """``kenning relayer`` for ``broker_url`` where importing ``module`` (an extra's client) fails."""
    fake = tmp_path / "no_extras" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    return kenning_cli(
        "relayer",
        "--no-migrate",
        "--broker-url",
        broker_url,
        env={"KENNING_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x", "PYTHONPATH": f"{fake.parent}:{REPO_ROOT}"},
    )
