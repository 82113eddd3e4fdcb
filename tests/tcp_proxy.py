"""A TCP forwarder a test can cut: the network between a process it started and a real
server (PostgreSQL, RabbitMQ, NATS), without touching the server the machine shares.

``stop()`` refuses new connections and cuts the open ones, as a restart or a network
failure does to the clients; ``start()`` brings it back on the same port. The forwarder
listens on 127.0.0.1 either way; where it forwards to is ``upstream``'s business (a TCP
address, or PostgreSQL's Unix socket): ``tests/brokers.py`` and ``tests/ingress_support.py``
each say it for their servers.

``blackhole()`` is the other way a network fails: packets dropped, no reset. Nothing is
forwarded any more and nothing is closed, either way (a side's close, once read, waits
too), so neither end hears a thing; ``blackhole_on(marker)`` does it when a client sends
``marker`` (that message held back: ``b"COMMIT\\x00"`` cuts a session between a
transaction's last statement and its commit); ``heal()`` forwards again what was held and what follows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tests.support import free_port

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class TcpForwarder:
    def __init__(self, upstream: Connect) -> None:
        self._upstream = upstream
        self.port = free_port()  # the same port again after stop(): one no connection takes
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._marker: bytes | None = None
        self._after = b""
        self.cut = asyncio.Event()  # set while blackholed

    def blackhole(self) -> None:
        self._flowing.clear()
        self.cut.set()

    def blackhole_on(self, marker: bytes, after: bytes = b"") -> None:
        """Blackhole once a client sends a chunk holding ``marker`` (held back with it) on
        a connection that sent ``after`` since this call (arm it before ``after`` is sent)."""
        self._marker, self._after = marker, after

    def heal(self) -> None:
        self._marker = None
        self.cut.clear()
        self._flowing.set()

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._connected, "127.0.0.1", self.port, reuse_address=True)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self.heal()  # pipes held by a blackhole see their sockets cut
        # the connections' handlers end once their sockets are cut: wait for them, or the
        # loop would close on pending tasks (and asyncio log an error for each)
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _connected(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        try:
            upstream_reader, upstream_writer = await self._upstream()
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool) -> None:
            primed = False  # this connection sent ``after`` while a marker was armed
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while True:
                    chunk = await reader.read(65536)
                    if from_client and self._marker is not None:
                        primed = primed or self._after in chunk
                        if primed and self._marker in chunk:
                            self._marker = None
                            self.blackhole()
                    await self._flowing.wait()  # a close too, under a blackhole
                    if not chunk:
                        break
                    writer.write(chunk)
                    await writer.drain()
            writer.transport.abort()

        # A handler cancelled when the test's loop closes would make asyncio's stream
        # callback log an error (Python 3.11 reads the task's exception unguarded).
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(
                pipe(client_reader, upstream_writer, True), pipe(upstream_reader, client_writer, False)
            )
        self._writers.difference_update((client_writer, upstream_writer))
