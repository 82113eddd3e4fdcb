"""A TCP forwarder a test can cut: the network between a process it started and a real
server (PostgreSQL, RabbitMQ, NATS), without touching the server the machine shares.

``stop()`` refuses new connections and cuts the open ones, as a restart or a network
failure does to the clients; ``start()`` brings it back on the same port. The forwarder
listens on 127.0.0.1 either way; where it forwards to is ``upstream``'s business (a TCP
address, or PostgreSQL's Unix socket): ``tests/brokers.py`` and ``tests/ingress_support.py``
each say it for their servers."""

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

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while chunk := await reader.read(65536):
                    writer.write(chunk)
                    await writer.drain()
            writer.transport.abort()

        # A handler cancelled when the test's loop closes would make asyncio's stream
        # callback log an error (Python 3.11 reads the task's exception unguarded).
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))
        self._writers.difference_update((client_writer, upstream_writer))
