"""Bearer tokens: ``KENNING_INGRESS_TOKEN`` for events, ``KENNING_ADMIN_TOKEN`` (when set)
for ``/cancel`` and ``/instances``. Compared in constant time."""

from __future__ import annotations

import hmac

from starlette.requests import Request


def required_token(*, admin: bool, ingress_token: str, admin_token: str) -> str:
    """The token a route needs ('' means open): admin routes take the admin token when one
    is set, else the ingress token, so a broker that may post events cannot cancel."""
    if admin and admin_token:
        return admin_token
    return ingress_token


def authorized(request: Request, expected: str) -> bool:
    if not expected:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # header values arrive latin-1 decoded: encoding back gives the bytes the client sent
    return hmac.compare_digest(presented.strip().encode("latin-1"), expected.encode("utf-8"))
