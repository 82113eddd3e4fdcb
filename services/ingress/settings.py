"""Ingress settings, read from the ``KENNING_*`` environment in every uvicorn worker.

``kenning ingress`` parses its flags (whose defaults are these variables) and writes them
back to the environment before uvicorn starts, so worker processes see the same values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from kenning.config import env_name
from kenning.ingress.parsing import DEFAULT_LIMITS, EventLimits

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_READ_TIMEOUT = 15.0


@dataclass(frozen=True)
class IngressSettings:
    database_url: str
    ingress_token: str = ""
    admin_token: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    database_timeout: float = 5.0  # connect, pool wait and per-request database time (s)
    limits: EventLimits = field(default_factory=lambda: DEFAULT_LIMITS)
    # seconds a client has to send a request's headers, and again its body (slowloris)
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES  # request line and headers together


# IngressSettings field -> the flag whose variable hands it to each uvicorn worker
_HANDED_OVER = {
    "database_url": "--database-url",
    "ingress_token": "--ingress-token",
    "admin_token": "--admin-token",
    "max_body_bytes": "--max-body-bytes",
    "database_timeout": "--database-timeout",
    "read_timeout": "--ingress-read-timeout",
    "max_header_bytes": "--ingress-max-header-bytes",
}
# EventLimits field -> its flag, the same way
_LIMITS_HANDED_OVER = {
    "max_attribute_length": "--ingress-max-attribute-length",
    "max_attribute_name_length": "--ingress-max-attribute-name-length",
    "max_extensions": "--ingress-max-extensions",
    "max_id_length": "--ingress-max-id-length",
}


def settings_to_environment(settings: IngressSettings) -> dict[str, str]:
    """The variables ``kenning ingress`` sets before uvicorn starts its workers: each
    setting under its flag's variable, which ``settings_from_environment`` reads back."""
    handed = {env_name(flag): str(getattr(settings, name)) for name, flag in _HANDED_OVER.items()}
    limits = {env_name(flag): str(getattr(settings.limits, name)) for name, flag in _LIMITS_HANDED_OVER.items()}
    return {**handed, **limits}


def _read(template: object, table: dict[str, str]) -> dict[str, Any]:
    """The fields of ``table`` set in the environment, of the type of ``template``'s."""
    found = {name: os.environ.get(env_name(flag)) for name, flag in table.items()}
    return {name: type(getattr(template, name))(raw) for name, raw in found.items() if raw is not None}


def settings_from_environment() -> IngressSettings:
    template = IngressSettings(database_url="")
    limits = replace(DEFAULT_LIMITS, **_read(DEFAULT_LIMITS, _LIMITS_HANDED_OVER))
    return replace(template, **_read(template, _HANDED_OVER), limits=limits)
