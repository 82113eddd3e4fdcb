"""Ingress settings, read from the ``KENNING_*`` environment in every uvicorn worker.

``kenning ingress`` parses its flags (whose defaults are these variables) and writes them
back to the environment before uvicorn starts, so worker processes see the same values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class IngressSettings:
    database_url: str
    ingress_token: str = ""
    admin_token: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    database_timeout: float = 5.0  # connect, pool wait and per-request database time (s)


def settings_from_environment() -> IngressSettings:
    env = os.environ
    return IngressSettings(
        database_url=env.get("KENNING_DATABASE_URL", ""),
        ingress_token=env.get("KENNING_INGRESS_TOKEN", ""),
        admin_token=env.get("KENNING_ADMIN_TOKEN", ""),
        max_body_bytes=int(env.get("KENNING_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)),
        database_timeout=float(env.get("KENNING_DATABASE_TIMEOUT", 5.0)),
    )
