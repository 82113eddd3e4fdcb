"""``kenning mcp --transport http``: the SDK's streamable HTTP app behind a bearer token.

Every request but ``GET /healthz`` carries ``Authorization: Bearer <token>`` when a token
is set (compared in constant time), else is answered 401 with a JSON error; without a
token the server listens on loopback only (``kenning.hosting.exposure``, as the console).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send


class BearerGuard:
    """ASGI middleware: requests without the token are refused before the MCP app sees them."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.token or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        said = "wrong bearer token" if given else "no bearer token: send Authorization: Bearer <KENNING_MCP_TOKEN>"
        body = json.dumps({"error": said}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="kenning"'),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
