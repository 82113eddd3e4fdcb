"""``kenning ingress``'s settings, declared once (``kenning.hosting.config``).

``IngressSettings`` makes the command's flags, their ``KENNING_*`` variables, defaults and
help. ``kenning ingress`` writes the settings it parsed back to the environment before
uvicorn starts, and every uvicorn worker reads them from there
(``settings_from_environment``), so worker processes see the same values.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

from kenning.hosting import config
from kenning.hosting.config import ProcessSettings, positive_float, positive_int, setting
from kenning_ingress.parsing import DEFAULT_LIMITS, EventLimits

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_READ_TIMEOUT = 15.0


@dataclass(frozen=True, kw_only=True)
class IngressSettings(ProcessSettings):
    PROCESS: ClassVar[str] = "ingress"

    host: str = setting("127.0.0.1", per_process=True, help="address to listen on (0.0.0.0 for every interface)")
    port: int = setting(8000, type=positive_int, per_process=True, help="port to listen on")
    workers: int = setting(1, type=positive_int, per_process=True, help="uvicorn worker processes")
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, type=positive_int, help="larger bodies get 413")
    # connect, pool wait and per-request database time
    database_timeout: float = setting(
        5.0, type=positive_float, help="seconds to connect to or wait on the database before answering 503"
    )
    ingress_token: str = setting("", help="bearer token required to post events (prefer the env)")
    admin_token: str = setting("", help="bearer token for /cancel and /instances (prefer the env)")
    # one event's attributes (``limits``)
    max_attribute_length: int = setting(
        DEFAULT_LIMITS.max_attribute_length,
        flag="--ingress-max-attribute-length",
        type=positive_int,
        help="characters in one attribute value; longer gets 400",
    )
    max_attribute_name_length: int = setting(
        DEFAULT_LIMITS.max_attribute_name_length,
        flag="--ingress-max-attribute-name-length",
        type=positive_int,
        help="characters in one attribute name (CloudEvents recommends 20)",
    )
    max_extensions: int = setting(
        DEFAULT_LIMITS.max_extensions,
        flag="--ingress-max-extensions",
        type=positive_int,
        help="extension attributes in one event",
    )
    max_id_length: int = setting(
        DEFAULT_LIMITS.max_id_length,
        flag="--ingress-max-id-length",
        type=positive_int,
        help="characters in an event's id and source, and in an instance id",
    )
    max_header_bytes: int = setting(  # request line and headers together
        DEFAULT_MAX_HEADER_BYTES,
        flag="--ingress-max-header-bytes",
        type=positive_int,
        help="bytes of request line and headers; more gets 431",
    )
    # seconds a client has to send a request's headers, and again its body (slowloris)
    read_timeout: float = setting(
        DEFAULT_READ_TIMEOUT,
        flag="--ingress-read-timeout",
        type=positive_float,
        help="seconds a client has to send a request's headers, and again its body; then 408",
    )
    sources: tuple[str, ...] = setting(
        (),
        flag="--source",
        variable="KENNING_INGRESS_SOURCES",
        repeatable=True,
        help="also consume CloudEvents from a broker into the inbox: amqp(s)://user:pass@host/vhost?queue=NAME or "
        "nats://host:4222?stream=NAME&consumer=NAME (docs/amqp.md, docs/nats.md); repeatable, the variable's "
        "URLs separated by spaces",
    )
    allow_open: bool = setting(
        False,
        flag="--ingress-allow-open",
        help="serve without KENNING_INGRESS_TOKEN on an address other than loopback (refused otherwise)",
    )

    @functools.cached_property
    def limits(self) -> EventLimits:
        """How large one event's attributes may be (what the parser checks)."""
        return EventLimits(
            max_attribute_length=self.max_attribute_length,
            max_attribute_name_length=self.max_attribute_name_length,
            max_extensions=self.max_extensions,
            max_id_length=self.max_id_length,
        )


def settings_to_environment(settings: IngressSettings) -> dict[str, str]:
    """The variables ``kenning ingress`` sets before uvicorn starts its workers: each
    setting under its variable, which ``settings_from_environment`` reads back."""
    return config.settings_to_environment(settings)


def settings_from_environment() -> IngressSettings:
    return config.settings_from_environment(IngressSettings)
