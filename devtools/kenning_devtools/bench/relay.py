"""The relayer's at-least-once guarantee, counted per target: events published through a
relayer that crashes after the broker answered and before it marked the rows
(``relayer.after_send`` at a rate), restarted until every event is published.

Each target is a real receiver: an HTTP sink in this process (it records each POST's
``ce-id`` before answering 204), a RabbitMQ queue on the default exchange and a JetStream
stream, each made for the run and removed after; a broker that does not answer is reported
as skipped, with the reason. Per target: the events, the broker's sends (outbox attempts),
the messages received, the distinct ids among them, the duplicates, the ids missing and the
crashes. A crash re-sends at most the one batch in flight, so duplicates <= crashes x batch
size; a JetStream stream drops a re-send by its ``Nats-Msg-Id`` and stores each event once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import psutil
import psycopg

from kenning.db import connect
from kenning.observability.faults import CRASH_EXIT_CODE
from kenning.storage.outbox import outbox_insert

EVENT_TYPE = "bench.relayed"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
_RELAYER = (
    "--no-migrate",
    "--lease-seconds",
    "1",  # a crashed relayer's batch is claimed again a second later
    "--poll-interval",
    "0.2",
    "--retry-initial-seconds",
    "0.05",
    "--retry-max-seconds",
    "0.5",
    "--request-timeout-seconds",
    "5",
    "--max-attempts",
    "1000",  # a crash counts as an attempt: no event may be dead-lettered by crashes
)


class Receiver(Protocol):
    name: str
    broker_url: str

    async def received(self) -> list[str]:
        """The event id of every message the target received (stored), in order."""
        ...


class HttpSink:
    """A minimal HTTP/1.1 server: each POST's ``ce-id`` is recorded, then answered 204."""

    name = "http"

    def __init__(self, port: int) -> None:
        self.broker_url = f"http://127.0.0.1:{port}/events"
        self.ids: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                headers = dict(
                    (name.strip().lower(), value.strip())
                    for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:] if line)
                )
                await reader.readexactly(int(headers.get("content-length", "0")))
                self.ids.append(headers.get("ce-id", ""))
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        writer.close()

    async def received(self) -> list[str]:
        return list(self.ids)


@contextlib.asynccontextmanager
async def http_sink() -> AsyncIterator[HttpSink]:
    server = await asyncio.start_server(lambda r, w: sink.serve(r, w), "127.0.0.1", 0)
    sink = HttpSink(server.sockets[0].getsockname()[1])
    try:
        yield sink
    finally:
        server.close()


class AmqpQueue:
    name = "amqp"

    def __init__(self, channel: Any, queue: str, url: str) -> None:
        self.channel, self.queue = channel, queue
        parts = urlsplit(url)
        self.broker_url = parts._replace(query=urlencode({"routing_key": queue}), fragment="").geturl()

    async def received(self) -> list[str]:
        queue = await self.channel.get_queue(self.queue)
        ids = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            ids.append(str(message.message_id))
        return ids


@contextlib.asynccontextmanager
async def amqp_queue(url: str) -> AsyncIterator[AmqpQueue]:
    """A durable queue of its own on ``url``'s vhost; the relayer publishes to it through
    the default exchange."""
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        name = f"kenning-bench-{uuid.uuid4().hex[:12]}"
        await channel.declare_queue(name, durable=True)
        try:
            yield AmqpQueue(channel, name, url)
        finally:
            await channel.queue_delete(name)
    finally:
        await connection.close()


class NatsStream:
    name = "nats"

    def __init__(self, jetstream: Any, stream: str, prefix: str, url: str) -> None:
        self.jetstream, self.stream = jetstream, stream
        parts = urlsplit(url)
        self.broker_url = parts._replace(query=urlencode({"subject": f"{prefix}.{{type}}"}), fragment="").geturl()

    async def received(self) -> list[str]:
        state = (await self.jetstream.stream_info(self.stream)).state
        if not state.messages:
            return []
        ids = []
        for seq in range(state.first_seq, state.last_seq + 1):
            message = await self.jetstream.get_msg(self.stream, seq)
            ids.append(str((message.headers or {}).get("Nats-Msg-Id", "")))
        return ids


@contextlib.asynccontextmanager
async def nats_stream(url: str) -> AsyncIterator[NatsStream]:
    """A stream of its own (subjects ``kenning-bench.<token>.>``, the default 2-minute
    duplicate window), deleted afterwards."""
    import nats

    client = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        token = uuid.uuid4().hex[:12]
        stream, prefix = f"KENNING_BENCH_{token.upper()}", f"kenning-bench.{token}"
        await jetstream.add_stream(name=stream, subjects=[f"{prefix}.>"])
        try:
            yield NatsStream(jetstream, stream, prefix, url)
        finally:
            with contextlib.suppress(Exception):
                await jetstream.delete_stream(stream)
    finally:
        await client.close()


async def _unreachable(url: str, default_port: int, module: str) -> str | None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1)
    except (OSError, TimeoutError):
        return f"not reachable on {host}:{port}"
    writer.close()
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed"
    return None


async def _insert_events(url: str, events: int, instances: int) -> None:
    database = connect(url)
    try:
        async with database.transaction() as conn:
            for n in range(events):
                await outbox_insert(
                    conn,
                    event_id=str(uuid.uuid4()),
                    instance_id=f"bench-relay-{n % instances}",
                    event_type=EVENT_TYPE,
                    source="/bench/relay",
                    content_type="application/json",
                    data_json=json.dumps({"n": n}),
                )
    finally:
        await database.dispose()


async def _outbox(url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT status, count(*), sum(attempts) FROM kenning_outbox GROUP BY status")
        rows = await cur.fetchall()
    counts = {str(status): int(count) for status, count, _ in rows}
    counts["attempts"] = sum(int(attempts or 0) for _, _, attempts in rows)
    return counts


def _spawn_relayer(url: str, broker_url: str, batch_size: int, crash_rate: float, seed: int, log: Path) -> Any:
    env = {
        **os.environ,
        "KENNING_DATABASE_URL": url,
        "KENNING_LOG_FORMAT": "json",
        "KENNING_LOG_LEVEL": "warning",
        # a seed per start: the same seed would crash every restart at the same draw
        "KENNING_FAULTS": f"relayer.after_send=crash%{crash_rate}",
        "KENNING_FAULTS_SEED": str(seed),
    }
    args = ["relayer", "--broker-url", broker_url, "--batch-size", str(batch_size), *_RELAYER]
    with open(log, "ab") as out:
        return psutil.Popen([sys.executable, "-m", "kenning", *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def _remove(log: Path) -> None:
    log.unlink(missing_ok=True)


async def _published_before_exit(url: str, relayer: Any, events: int, deadline: float, name: str, log: Path) -> bool:
    """True once every event is published (the relayer is then stopped), False when the
    relayer exited first."""
    while relayer.poll() is None:
        outbox = await _outbox(url)
        if outbox.get("published", 0) == events:
            relayer.send_signal(signal.SIGTERM)
            await asyncio.to_thread(relayer.wait, 20)
            return True
        if outbox.get("failed") or time.monotonic() > deadline:
            relayer.kill()
            raise RuntimeError(f"{name}: dead letters or out of time, outbox {outbox}\n{_tail(log)}")
        await asyncio.sleep(0.1)
    return False


async def relay_through(
    url: str, receiver: Receiver, events: int, instances: int, batch_size: int, crash_rate: float, timeout: float
) -> dict[str, Any]:
    """Publish ``events`` new outbox events to ``receiver`` with crashing relayers, one at a
    time, restarted until every event is published; then count what arrived."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DELETE FROM kenning_outbox")  # the scratch database's: one target at a time
    await _insert_events(url, events, instances)
    log = Path(tempfile.mkstemp(prefix=f"kenning-bench-relay-{receiver.name}-", suffix=".log")[1])
    started = time.monotonic()
    crashes = starts = 0
    while True:
        relayer = _spawn_relayer(url, receiver.broker_url, batch_size, crash_rate, starts, log)
        starts += 1
        if await _published_before_exit(url, relayer, events, started + timeout, f"{receiver.name}", log):
            break
        if relayer.returncode != CRASH_EXIT_CODE:
            raise RuntimeError(f"{receiver.name}: relayer exited {relayer.returncode}\n{_tail(log)}")
        crashes += 1
    seconds = round(time.monotonic() - started, 2)
    received = await receiver.received()
    counted = Counter(received)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        outbox_ids = {str(row[0]) for row in await (await conn.execute("SELECT id FROM kenning_outbox")).fetchall()}
    outbox = await _outbox(url)
    _remove(log)
    return {
        "target": receiver.name,
        "events": events,
        "sends": outbox["attempts"],  # publishes the relayer made: each event once, plus the re-sends
        "messages": len(received),
        "distinct": len(counted),
        "duplicates": len(received) - len(counted),
        "missing": len(outbox_ids - set(counted)),
        "crashes": crashes,
        "relayer_starts": starts,
        "max_duplicates": crashes * batch_size,  # what at-least-once allows: a batch per crash
        "seconds": seconds,
    }


async def run_relay(
    url: str,
    events: int,
    instances: int,
    batch_size: int,
    crash_rate: float,
    amqp_url: str = DEFAULT_AMQP_URL,
    nats_url: str = DEFAULT_NATS_URL,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """The run against each target that answers; one that does not is listed as skipped."""
    results: list[dict[str, Any]] = []

    async def measure(receiver: Receiver) -> None:
        results.append(await relay_through(url, receiver, events, instances, batch_size, crash_rate, timeout))

    async with http_sink() as sink:
        await measure(sink)
    reason = await _unreachable(amqp_url, 5672, "aio_pika")
    if reason is None:
        async with amqp_queue(amqp_url) as queue:
            await measure(queue)
    else:
        results.append({"target": "amqp", "skipped": f"RabbitMQ {reason}"})
    reason = await _unreachable(nats_url, 4222, "nats")
    if reason is None:
        async with nats_stream(nats_url) as stream:
            await measure(stream)
    else:
        results.append({"target": "nats", "skipped": f"NATS {reason}"})
    return {
        "events": events,
        "instances": instances,
        "batch_size": batch_size,
        "crash_rate": crash_rate,
        "targets": results,
    }
