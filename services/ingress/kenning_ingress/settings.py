"""Ingress settings, read from the ``KENNING_*`` environment in every uvicorn worker.

``OPTIONS`` declares each setting once (flag, variable, type, help, the field it fills):
``kenning ingress`` parses its flags from it (whose defaults are these variables) and
writes them back to the environment before uvicorn starts, so worker processes see the
same values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kenning.config import env_name, positive_float, positive_int
from kenning_ingress.parsing import DEFAULT_LIMITS, EventLimits

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


@dataclass(frozen=True)
class Option:
    """One ``kenning ingress`` setting, declared once: its flag (and through
    ``kenning.config`` its ``KENNING_*`` variable), how it is parsed, its help, and the field
    it fills. Its default is that field's default. ``kenning ingress`` declares the flag,
    fills the settings from it, and hands the value to each uvicorn worker in the
    variable, which the worker reads back with ``type``."""

    flag: str
    field: str  # an IngressSettings field, or ``limits.`` and an EventLimits field
    type: Callable[[str], Any]
    help: str

    @property
    def dest(self) -> str:
        """The ``argparse`` attribute of the flag."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def variable(self) -> str:
        return env_name(self.flag)

    @property
    def default(self) -> Any:
        return self.value(_DEFAULTS)

    def value(self, settings: IngressSettings) -> Any:
        owner: object = settings
        for part in self.field.split("."):
            owner = getattr(owner, part)
        return owner


OPTIONS = (
    Option("--max-body-bytes", "max_body_bytes", positive_int, "larger bodies get 413"),
    Option(
        "--database-timeout",
        "database_timeout",
        positive_float,
        "seconds to connect to or wait on the database before answering 503",
    ),
    Option("--ingress-token", "ingress_token", str, "bearer token required to post events (prefer the env)"),
    Option("--admin-token", "admin_token", str, "bearer token for /cancel and /instances (prefer the env)"),
    Option(
        "--ingress-max-attribute-length",
        "limits.max_attribute_length",
        positive_int,
        "characters in one attribute value; longer gets 400",
    ),
    Option(
        "--ingress-max-attribute-name-length",
        "limits.max_attribute_name_length",
        positive_int,
        "characters in one attribute name (CloudEvents recommends 20)",
    ),
    Option("--ingress-max-extensions", "limits.max_extensions", positive_int, "extension attributes in one event"),
    Option(
        "--ingress-max-id-length",
        "limits.max_id_length",
        positive_int,
        "characters in an event's id and source, and in an instance id",
    ),
    Option(
        "--ingress-max-header-bytes",
        "max_header_bytes",
        positive_int,
        "bytes of request line and headers; more gets 431",
    ),
    Option(
        "--ingress-read-timeout",
        "read_timeout",
        positive_float,
        "seconds a client has to send a request's headers, and again its body; then 408",
    ),
)
_DEFAULTS = IngressSettings(database_url="")
# declared with the other processes' (kenning.config.add_database_options), handed over too
_DATABASE_URL = env_name("--database-url")


def settings_of(database_url: str, values: Mapping[str, Any]) -> IngressSettings:
    """Settings from option values by field (``Option.field``); a missing one is its
    default."""
    top = {field: value for field, value in values.items() if not field.startswith("limits.")}
    limits = {field.removeprefix("limits."): value for field, value in values.items() if field.startswith("limits.")}
    return replace(_DEFAULTS, database_url=database_url, limits=replace(DEFAULT_LIMITS, **limits), **top)


def settings_to_environment(settings: IngressSettings) -> dict[str, str]:
    """The variables ``kenning ingress`` sets before uvicorn starts its workers: each
    setting under its flag's variable, which ``settings_from_environment`` reads back."""
    return {_DATABASE_URL: settings.database_url, **{o.variable: str(o.value(settings)) for o in OPTIONS}}


def settings_from_environment() -> IngressSettings:
    values = {o.field: o.type(raw) for o in OPTIONS if (raw := os.environ.get(o.variable)) is not None}
    return settings_of(os.environ.get(_DATABASE_URL, ""), values)
