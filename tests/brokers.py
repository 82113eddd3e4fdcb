"""Helpers for tests against the machine's real brokers: RabbitMQ (AMQP 0-9-1) and NATS
with JetStream.

Each test works in a place of its own: a throwaway RabbitMQ vhost (``rabbitmqctl``, when
this user may run it; else unique exchange and queue names in ``KENNING_TEST_AMQP_URL``'s
vhost) and a throwaway JetStream stream on unique subjects, deleted afterwards. Where a
server does not answer, ``require_rabbitmq`` / ``require_nats`` skip the test with the
reason (never silently). The servers: ``KENNING_TEST_AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672/``) and ``KENNING_TEST_NATS_URL`` (default
``nats://127.0.0.1:4222``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import pytest

from kenning.hosting.executables import find_executable
from tests.tcp_proxy import TcpForwarder

AMQP_URL = os.environ.get("KENNING_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("KENNING_TEST_NATS_URL", "nats://127.0.0.1:4222")
_RABBITMQCTL_TIMEOUT = 30.0


def unique_name(prefix: str = "kt") -> str:
    """A name no other test (or test run) uses: ``prefix-<12 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def tcp_reachable(url: str, default_port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=timeout):
            return True
    except OSError:
        return False


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def rabbitmq_unreachable_reason(url: str = AMQP_URL) -> str | None:
    """Why the RabbitMQ tests cannot run here, or None when the server answers."""
    if not tcp_reachable(url, 5672):
        return f"RabbitMQ not reachable on {_where(url) if urlsplit(url).port else url} (KENNING_TEST_AMQP_URL)"
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        return "aio-pika is not installed (pip install 'kenning[amqp]')"
    return None


def nats_unreachable_reason(url: str = NATS_URL) -> str | None:
    """Why the NATS tests cannot run here, or None when the server answers."""
    if not tcp_reachable(url, 4222):
        return f"NATS not reachable on {_where(url) if urlsplit(url).port else url} (KENNING_TEST_NATS_URL)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install 'kenning[nats]')"
    return None


def require_rabbitmq(url: str = AMQP_URL) -> None:
    """Skip the calling test, with the reason, when RabbitMQ does not answer."""
    reason = rabbitmq_unreachable_reason(url)
    if reason:
        pytest.skip(reason)


def require_nats(url: str = NATS_URL) -> None:
    """Skip the calling test, with the reason, when NATS does not answer."""
    reason = nats_unreachable_reason(url)
    if reason:
        pytest.skip(reason)


@functools.cache  # each call starts an Erlang VM (about a second): ask once per session
def rabbitmqctl_available() -> bool:
    """Whether this user can manage the local RabbitMQ with ``rabbitmqctl`` (root can)."""
    if find_executable("rabbitmqctl") is None:  # in /usr/sbin: not on every PATH root has
        return False
    try:
        return rabbitmqctl("status", check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``rabbitmqctl ARGS`` (quietly); raises on failure when ``check``."""
    return subprocess.run(
        [find_executable("rabbitmqctl") or "rabbitmqctl", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=_RABBITMQCTL_TIMEOUT,
        check=check,
    )


def require_rabbitmqctl() -> None:
    """Skip the calling test when it needs ``rabbitmqctl`` (to cut connections or delete a
    vhost) and this user cannot run it."""
    if not rabbitmqctl_available():
        pytest.skip("rabbitmqctl is not available to this user (it manages vhosts and connections)")


class TcpProxy(TcpForwarder):
    """The network between a process and a real broker, which the test can cut
    (``tests.tcp_proxy``): a forwarder to ``upstream_url``'s host and port."""

    def __init__(self, upstream_url: str, default_port: int) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or default_port)
        super().__init__(lambda: asyncio.open_connection(*self.upstream))

    def url(self, url: str) -> str:
        """``url`` (same scheme, credentials, path and query) through this proxy."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@contextlib.asynccontextmanager
async def tcp_proxy(upstream_url: str, default_port: int, *, started: bool = True) -> AsyncIterator[TcpProxy]:
    """A ``TcpProxy`` to ``upstream_url``, stopped afterwards; down at first unless ``started``."""
    proxy = TcpProxy(upstream_url, default_port)
    if started:
        await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@dataclass(frozen=True)
class RabbitVhost:
    """A vhost for one test (or one module) and the AMQP URL that reaches it."""

    name: str
    url: str  # amqp://user:pass@host:port/<vhost, percent-encoded>
    throwaway: bool  # False: rabbitmqctl was unavailable; this is the shared vhost, names must be unique

    def relayer_url(self, **query: str) -> str:
        """This vhost's URL with a query (``exchange=...``, ``routing_key=...``)."""
        return with_query(self.url, **query)


def with_query(url: str, **query: str) -> str:
    """``url`` with its query replaced by ``query`` (percent-encoded)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def vhost_url(vhost: str, base: str = AMQP_URL) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), "", ""))


@contextlib.contextmanager
def rabbitmq_vhost(prefix: str = "kenning-test") -> Iterator[RabbitVhost]:
    """A fresh vhost where guest may do anything, deleted afterwards (about 2 s of
    ``rabbitmqctl`` in all, so share one per module where tests can). Without
    ``rabbitmqctl``: the URL's own vhost, and the caller's names must be unique."""
    require_rabbitmq()
    if not rabbitmqctl_available():
        path = urlsplit(AMQP_URL).path
        yield RabbitVhost(name=path[1:] or "/", url=AMQP_URL, throwaway=False)
        return
    name = unique_name(prefix)
    user = urlsplit(AMQP_URL).username or "guest"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        yield RabbitVhost(name=name, url=vhost_url(name), throwaway=True)
    finally:
        rabbitmqctl("delete_vhost", name, check=False)


def rabbitmq_queue_counts(vhost: RabbitVhost, queue: str) -> tuple[int, int]:
    """``(ready, unacknowledged)`` messages of ``queue`` as RabbitMQ counts them (about a
    second of ``rabbitmqctl``; callers check ``rabbitmqctl_available()`` first)."""
    listed = rabbitmqctl(
        "list_queues", "-p", vhost.name, "--no-table-headers", "name", "messages_ready", "messages_unacknowledged"
    ).stdout
    for line in listed.splitlines():
        name, ready, unacked = line.split("\t")
        if name == queue:
            return int(ready), int(unacked)
    raise AssertionError(f"no queue {queue!r} in vhost {vhost.name!r}")


def close_rabbitmq_connections(vhost: RabbitVhost, reason: str = "closed by the test") -> None:
    """Close every client connection to ``vhost`` (as a broker restart does, for its clients)."""
    rabbitmqctl("close_all_connections", "--vhost", vhost.name, "--limit", "1000", reason)


@contextlib.asynccontextmanager
async def amqp_channel(url: str) -> AsyncIterator[Any]:
    """An aio-pika channel on ``url`` (publisher confirms on), closed afterwards."""
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


async def amqp_bound_queue(
    channel: Any,
    exchange: str,
    binding_key: str = "#",
    *,
    exchange_type: str = "topic",
    queue: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> Any:
    """Declare a durable ``exchange`` (topic by default) and a queue bound to it by
    ``binding_key``; returns the aio-pika queue."""
    import aio_pika

    declared = await channel.declare_exchange(exchange, aio_pika.ExchangeType(exchange_type), durable=True)
    bound = await channel.declare_queue(queue or unique_name("q"), durable=True, arguments=arguments)
    await bound.bind(declared, routing_key=binding_key)
    return bound


async def amqp_messages(queue: Any, count: int, timeout: float = 15.0) -> list[Any]:
    """The first ``count`` messages on ``queue``, acknowledged; fails after ``timeout`` s."""
    got: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < count:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            got.append(message)
            continue
        if loop.time() > deadline:
            raise AssertionError(f"{len(got)} of {count} messages arrived on {queue.name} within {timeout} s")
        await asyncio.sleep(0.02)
    return got


async def amqp_queue_drained(queue: Any, settle: float = 0.3) -> list[Any]:
    """Every message left on ``queue`` once none arrives for ``settle`` seconds."""
    got: list[Any] = []
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while loop.time() - quiet_since < settle:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            await asyncio.sleep(0.02)
        else:
            got.append(message)
            quiet_since = loop.time()
    return got


@dataclass(frozen=True)
class JetStreamStream:
    """A stream for one test: its name, the subjects it holds (``prefix.>``) and the server."""

    name: str
    prefix: str  # subjects under it belong to this stream: f"{prefix}.orders"
    url: str

    def subject(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    def relayer_url(self, **query: str) -> str:
        """The server's URL with a query (``subject=...``)."""
        return with_query(self.url, **query)


@contextlib.asynccontextmanager
async def nats_connection(url: str = NATS_URL) -> AsyncIterator[Any]:
    """A nats-py client, drained afterwards (no reconnect attempts: a test fails fast)."""
    import nats

    client = await nats.connect(url, connect_timeout=3, allow_reconnect=False)
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def jetstream_stream(duplicate_window: float = 120.0, **config: Any) -> AsyncIterator[JetStreamStream]:
    """A fresh JetStream stream (file storage, unique name and subjects), deleted afterwards.
    ``duplicate_window`` is the seconds a ``Nats-Msg-Id`` is remembered for dedup."""
    require_nats()
    token = uuid.uuid4().hex[:12]
    stream = JetStreamStream(name=f"KENNING_TEST_{token.upper()}", prefix=f"kenning-test.{token}", url=NATS_URL)
    async with nats_connection() as client:
        js = client.jetstream()
        await js.add_stream(
            name=stream.name, subjects=[f"{stream.prefix}.>"], duplicate_window=duplicate_window, **config
        )
        try:
            yield stream
        finally:
            with contextlib.suppress(Exception):
                await js.delete_stream(stream.name)


async def stream_messages(stream: JetStreamStream) -> list[Any]:
    """Every message stored in ``stream``, in sequence order (nats-py ``RawStreamMsg``:
    ``.subject``, ``.headers``, ``.data``, ``.seq``)."""
    async with nats_connection(stream.url) as client:
        js = client.jetstream()
        info = await js.stream_info(stream.name)
        if not info.state.messages:
            return []
        return [await js.get_msg(stream.name, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
