"""uvicorn's HTTP protocol (httptools), with the ingress's answers where uvicorn writes its own.

uvicorn answers malformed HTTP itself, in plain text, before any ASGI app runs, and puts
no bound on how long a client may take to send its headers or how large they may grow.
This subclass, passed to ``uvicorn.run(http=...)``, changes three things and nothing else:

- malformed HTTP gets the ingress's JSON 400 (``invalid_request``);
- a request line and headers over ``--ingress-max-header-bytes`` get a JSON 431
  (``limit_exceeded``): counted as bytes arrive, so a never-ending header is cut too;
- a client that does not finish its headers within ``--ingress-read-timeout`` of its
  first byte gets a JSON 408 (``request_timeout``) and the connection is closed; one that
  connects and sends nothing is closed without an answer. (The body has the same deadline,
  enforced by the app while it reads it; idle keep-alive connections are uvicorn's own
  ``timeout_keep_alive``.)
"""

from __future__ import annotations

import asyncio
import functools
import json
from http import HTTPStatus
from typing import Any

import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kenning_ingress.settings import settings_from_environment

_log = structlog.get_logger("kenning.ingress")


@functools.cache
def _limits() -> tuple[float, int]:
    """(read timeout, header byte limit), from the environment ``kenning ingress`` set."""
    settings = settings_from_environment()
    return settings.read_timeout, settings.max_header_bytes


def json_response(status: int, message: str, error_type: str) -> bytes:
    """A complete HTTP/1.1 response closing the connection, in the ingress's error shape."""
    body = json.dumps({"error": message, "error_type": error_type, "retryable": False}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class IngressProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout, self._max_header_bytes = _limits()
        self._reading_headers = True  # until the first request's headers are complete
        self._header_bytes = 0
        self._started = False  # a byte of the current request has arrived
        self._deadline: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a client that connects and says nothing is cut as well

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._reading_headers or self.transport.is_closing():
            return
        # Still inside a request's head after this chunk: count it. (The chunk that ends
        # the head is not counted: it is bounded by the transport's read size.)
        self._header_bytes += len(data)
        if self._header_bytes > self._max_header_bytes:
            self._refuse(
                431, f"request line and headers over {self._max_header_bytes} bytes (--ingress-max-header-bytes)"
            )

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self._reply(400, "malformed HTTP request", "invalid_request")

    # ------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._started = True
        self._header_bytes = 0
        self._arm()  # the head must be complete this long after its first byte

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._started = False
        self._disarm()
        super().on_headers_complete()

    # ------------------------------------------------------------ the deadline

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self._read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._reading_headers:
            return
        if not self._started:
            self.transport.close()  # no request began: there is nothing to answer
            return
        _log.info("request.read_timeout", seconds=self._read_timeout, client=_peer(self.client))
        self._reply(
            408,
            f"the request headers did not arrive within {self._read_timeout:g} s (--ingress-read-timeout)",
            "request_timeout",
        )

    def _refuse(self, status: int, message: str) -> None:
        _log.info("request.refused", status=status, client=_peer(self.client))
        self._disarm()
        self._reply(status, message, "limit_exceeded")

    def _reply(self, status: int, message: str, error_type: str) -> None:
        self._reading_headers = False
        self.transport.write(json_response(status, message, error_type))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None
