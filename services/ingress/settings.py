"""Ingress settings, read from the ``KENNING_*`` environment in every uvicorn worker.

``kenning ingress`` parses its flags (whose defaults are these variables) and writes them
back to the environment before uvicorn starts, so worker processes see the same values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

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


def settings_from_environment() -> IngressSettings:
    env = os.environ
    return IngressSettings(
        database_url=env.get("KENNING_DATABASE_URL", ""),
        ingress_token=env.get("KENNING_INGRESS_TOKEN", ""),
        admin_token=env.get("KENNING_ADMIN_TOKEN", ""),
        max_body_bytes=int(env.get("KENNING_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)),
        database_timeout=float(env.get("KENNING_DATABASE_TIMEOUT", 5.0)),
        limits=EventLimits(
            max_attribute_length=int(
                env.get("KENNING_INGRESS_MAX_ATTRIBUTE_LENGTH", DEFAULT_LIMITS.max_attribute_length)
            ),
            max_attribute_name_length=int(
                env.get("KENNING_INGRESS_MAX_ATTRIBUTE_NAME_LENGTH", DEFAULT_LIMITS.max_attribute_name_length)
            ),
            max_extensions=int(env.get("KENNING_INGRESS_MAX_EXTENSIONS", DEFAULT_LIMITS.max_extensions)),
            max_id_length=int(env.get("KENNING_INGRESS_MAX_ID_LENGTH", DEFAULT_LIMITS.max_id_length)),
        ),
        read_timeout=float(env.get("KENNING_INGRESS_READ_TIMEOUT", DEFAULT_READ_TIMEOUT)),
        max_header_bytes=int(env.get("KENNING_INGRESS_MAX_HEADER_BYTES", DEFAULT_MAX_HEADER_BYTES)),
    )
