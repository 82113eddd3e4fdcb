"""The rule the HTTP processes (ingress, console) apply before they listen: no token on
an address others can reach is refused, unless the operator said it is meant to be open."""

from __future__ import annotations

import ipaddress

import structlog

from kenning.errors import UsageError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(
    *, host: str, port: int, guarded: bool, allow_open: bool, refusal: str, logger: str, event: str, reason: str
) -> None:
    """Return if a token guards the listener or ``host`` is loopback; else raise
    ``UsageError(refusal)`` (exit code 2) unless ``allow_open``, in which case the
    ``event`` warning says that nothing guards it."""
    if guarded or is_loopback(host):
        return
    if not allow_open:
        raise UsageError(refusal)
    structlog.get_logger(logger).warning(event, host=host, port=port, reason=reason)
