"""``kenning mcp``'s settings, declared once (``kenning.hosting.config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kenning.hosting.config import ProcessSettings, port_number, setting

TRANSPORTS = ("stdio", "http")


@dataclass(frozen=True, kw_only=True)
class McpSettings(ProcessSettings):
    """``kenning mcp``'s options."""

    PROCESS: ClassVar[str] = "mcp"

    transport: str = setting(
        "stdio",
        choices=TRANSPORTS,
        per_process=True,
        help="stdio: the assistant starts this command and talks on its stdin/stdout; http: serve streamable "
        "HTTP at /mcp on --host and --port",
    )
    host: str = setting("127.0.0.1", per_process=True, help="with --transport http: the address to listen on")
    port: int = setting(8400, type=port_number, per_process=True, help="with --transport http: the port")
    token: str = setting(
        "",
        per_process=True,
        help="with --transport http: the bearer token every request must carry (prefer the env); required to "
        "listen beyond loopback",
    )
    allow_actions: bool = setting(
        False,
        per_process=True,
        help="offer the actions (cancel, retry, terminate, skip a compensation, bulk actions, schedule pause, "
        "resume and trigger); without it every action is refused: read-only",
    )
    app: str = setting(
        "",
        help="modules defining workflows (module[:attribute],...): the code the replay_check tool replays "
        "histories against",
    )
