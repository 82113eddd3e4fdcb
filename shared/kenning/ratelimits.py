"""``RateLimit``: at most ``limit`` starts per ``period`` seconds for each key of a queue.

Declared on a queue, ``Queue("emails", partition_rate_limit=RateLimit(limit=10, period=60,
key="customer"))``: each partition key of the queue gets its own window, which the queued
claim enforces in the database (``kenning/storage/claims.py``) the way it enforces the
queue's own ``rate_limit``. A start counts when it is first claimed (``started_at``), so a
key's instances over its limit wait durably in the queue (they do not fail): the claim
moves their due time to when the key's window frees, and serves the other keys meanwhile.

``key`` names an input field whose value is the start's partition key when the start
gives none (``partition_key=`` wins); without ``key``, the partition key alone says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kenning.errors import ConfigurationError

# The largest value an integer column holds.
_MAX_INT = 2**31 - 1


@dataclass(frozen=True)
class RateLimit:
    limit: int
    period: float
    key: str | None = None

    def __post_init__(self) -> None:
        if type(self.limit) is not int or not 0 < self.limit <= _MAX_INT:
            raise ConfigurationError(f"RateLimit: limit= must be a positive int, got {self.limit!r}")
        if not isinstance(self.period, int | float) or not math.isfinite(self.period) or self.period <= 0:
            raise ConfigurationError(f"RateLimit: period= must be a positive number of seconds, got {self.period!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ConfigurationError(f"RateLimit: key= must name an input field, got {self.key!r}")
