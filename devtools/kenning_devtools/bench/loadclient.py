"""A lean HTTP/1.1 load client: one kept-alive asyncio stream per client, requests
written as bytes and responses read by ``Content-Length``.

httpx spends about 1.4 ms of CPU per request here, as much as the ingress it measures,
and both share the same two cores; this client spends a tenth of that, so the ingress's
rate is measured instead of the load generator's. Events are still built by the official
SDK (``binary_event``); only the transport is hand-written.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class ResponseError(Exception):
    """The server answered something this client cannot read (or closed the connection)."""


def encode_request(host: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "content-length"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One kept-alive connection; ``post`` sends a request and returns the status code."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, base_url: str) -> Connection:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the load client speaks plain http to host:port, not {base_url!r}")
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def post(self, headers: dict[str, str], body: bytes, path: str = "/") -> int:
        self.writer.write(encode_request(self.host, path, headers, body))
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as lost:
            raise ResponseError(f"connection closed before a response: {lost!r}") from lost
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError) as bad:
            raise ResponseError(f"not an HTTP status line: {status_line!r}") from bad
        length = None
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length is None:
            raise ResponseError("response without Content-Length (chunked answers are not expected here)")
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
