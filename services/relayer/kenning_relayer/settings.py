"""Relayer settings, light enough to import for ``kenning --help``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ContentMode = Literal["binary", "structured"]
CONTENT_MODES: tuple[ContentMode, ...] = ("binary", "structured")


@dataclass(frozen=True)
class RelayerSettings:
    broker_url: str
    content_mode: ContentMode = "binary"
    batch_size: int = 50
    max_connections: int = 20
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    request_timeout_seconds: float = 10.0
    max_attempts: int = 10
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 300.0
    retention_hours: float = 168.0
    cleanup_interval_seconds: float = 60.0
    cleanup_batch_size: int = 1000
    shutdown_grace_seconds: float = 10.0
    listen: bool = True
    relayer_id: str = ""
