"""Retry policies for activities and compensations (Edda 0.1.0's defaults and presets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kenning.errors import TerminalError


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how far apart an activity is retried.

    Delay before attempt ``n + 1`` is ``initial_interval * backoff_coefficient ** (n - 1)``,
    capped at ``max_interval``. ``None`` for ``max_attempts`` or ``max_duration`` means
    unlimited. Attempts are counted in the database, so a crash does not reset them.
    """

    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 60.0
    max_attempts: int | None = 5
    max_duration: float | None = 300.0
    retryable_error_types: tuple[type[BaseException], ...] = (Exception,)
    non_retryable_error_types: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.initial_interval < 0 or self.max_interval < 0:
            raise ValueError("RetryPolicy intervals must not be negative")
        if self.backoff_coefficient < 1:
            raise ValueError("RetryPolicy.backoff_coefficient must be at least 1")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be at least 1 or None")

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        delay = self.initial_interval * self.backoff_coefficient ** (attempt - 1)
        return float(min(delay, self.max_interval))

    def is_retryable(self, error: BaseException) -> bool:
        if isinstance(error, TerminalError):
            return False
        if self.non_retryable_error_types and isinstance(error, self.non_retryable_error_types):
            return False
        return isinstance(error, self.retryable_error_types)

    def to_json(self) -> dict[str, Any]:
        """The numeric part, stored with compensations so another worker retries them alike."""
        return {
            "initial_interval": self.initial_interval,
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval": self.max_interval,
            "max_attempts": self.max_attempts,
            "max_duration": self.max_duration,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetryPolicy:
        return cls(**data)


DEFAULT_RETRY_POLICY = RetryPolicy()
AGGRESSIVE_RETRY = RetryPolicy(
    initial_interval=0.1, backoff_coefficient=1.5, max_interval=10.0, max_attempts=10, max_duration=60.0
)
CONSERVATIVE_RETRY = RetryPolicy(
    initial_interval=5.0, backoff_coefficient=2.0, max_interval=300.0, max_attempts=3, max_duration=900.0
)
INFINITE_RETRY = RetryPolicy(max_attempts=None, max_duration=None)
