"""``kenning console``'s settings, declared once (``kenning.hosting.config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kenning.hosting.config import ProcessSettings, positive_float, positive_int, setting


@dataclass(frozen=True, kw_only=True)
class ConsoleSettings(ProcessSettings):
    """``kenning console``'s options."""

    PROCESS: ClassVar[str] = "console"

    host: str = setting("127.0.0.1", per_process=True, help="address to listen on (0.0.0.0 for every interface)")
    port: int = setting(8300, type=positive_int, per_process=True, help="port to listen on")
    app: str = setting(
        "",
        help="modules defining workflows, for the start form and workflow names: module[:attribute][,module...]",
    )
    # the same variable as the ingress's: one token guards every operator action
    admin_token: str = setting("", help="token a browser logs in with, or a bearer token (prefer the env)")
    session_hours: float = setting(
        12.0,
        type=positive_float,
        flag="--console-session-hours",
        help="hours a browser's login lasts: its session cookie (even a copied one) is refused after that",
    )
    allow_open: bool = setting(
        False,
        flag="--console-allow-open",
        help="serve without KENNING_ADMIN_TOKEN on an address other than loopback (refused otherwise)",
    )
    allowed_hosts: tuple[str, ...] = setting(
        (),
        flag="--console-allowed-hosts",
        repeatable=True,
        help="without an admin token, the Host names the console answers to besides localhost, 127.0.0.1 and "
        "[::1] (any port): a page on another name is a DNS rebinding attempt",
    )
    page_size: int = setting(50, type=positive_int, flag="--console-page-size", help="instances per list page")
    refresh_interval: float = setting(
        5.0, type=positive_float, flag="--console-refresh-interval", help="seconds between the list's auto-refreshes"
    )
    max_streams: int = setting(
        100, type=positive_int, flag="--console-max-streams", help="live-update streams open at once (503 beyond)"
    )
    database_timeout: float = setting(
        5.0, type=positive_float, help="seconds to connect to or wait on the database before answering 503"
    )
