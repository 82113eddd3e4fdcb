"""``kenning relayer``'s settings, declared once (``kenning.hosting.config``), light enough to
import for ``kenning --help``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kenning.hosting.config import ServiceSettings, non_negative_float, positive_float, positive_int, setting

ContentMode = Literal["binary", "structured"]
CONTENT_MODES: tuple[ContentMode, ...] = ("binary", "structured")


@dataclass(frozen=True, kw_only=True)
class RelayerSettings(ServiceSettings):
    PROCESS: ClassVar[str] = "relayer"

    broker_url: str = setting(
        "",
        help="where events go: http(s)://... (POST), amqp(s)://...?exchange=... (RabbitMQ), "
        "nats://...?subject=... (JetStream; tls:// over TLS)",
    )
    app: str = setting("", help="optional: module[:attribute] whose App's broker_url and db_url are the fallbacks")
    # a field specifier, as dataclasses.field is (ruff cannot tell for a Literal)
    content_mode: ContentMode = setting("binary", choices=CONTENT_MODES, help="CloudEvents content mode")  # noqa: RUF009
    batch_size: int = setting(50, type=positive_int, per_process=True, help="events claimed and sent at once")
    max_connections: int = setting(20, type=positive_int, help="HTTP connections to the broker")
    lease_seconds: float = setting(30.0, type=positive_float, per_process=True, help="lease on a claimed batch")
    request_timeout_seconds: float = setting(
        10.0, type=positive_float, help="timeout per event: HTTP answer, broker connect, AMQP confirm, JetStream ack"
    )
    max_attempts: int = setting(10, type=positive_int, help="attempts before an event is dead")
    retry_initial_seconds: float = setting(1.0, type=positive_float, help="first retry back-off")
    retry_max_seconds: float = setting(300.0, type=positive_float, help="longest retry back-off")
    retention_hours: float = setting(168.0, type=non_negative_float, help="keep published events this long")
    cleanup_interval_seconds: float = setting(60.0, type=positive_float, help="how often old events go")
    cleanup_batch_size: int = 1000  # published rows deleted per statement
    shutdown_grace_seconds: float = setting(
        10.0, type=float, per_process=True, help="on SIGTERM, time for the batch in flight"
    )
    relayer_id: str = setting("", help="name in leases and logs (default host-pid-random)")
