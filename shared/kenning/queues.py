"""``Queue``: a named queue with limits that the claim enforces in the database.

Declared in the application's code (``Queue("payments", concurrency=3)``) and named by
``@workflow(queue=...)`` or ``Client.start(..., queue=...)``. Workers write the
declarations of the modules they load to ``kenning_queues`` when they start; the queued
claim (``kenning/storage/queues.py``) reads the limits from there, so every worker, and
every process that crashed and came back, applies the same ones. A start into a queue no
worker declared creates it bare (no limits) until one does.

- ``concurrency``: instances of the queue held by workers at once, across all workers;
- ``worker_concurrency``: the same, per worker;
- ``rate_limit=(n, seconds)``: at most ``n`` first claims (starts) in any ``seconds``;
- ``partition_concurrency``: per partition key (``Client.start(..., partition_key=...)``);
  partitions are served round-robin either way, so one key's backlog cannot starve another;
- ``partition_strategy``: what a start does when its key is at ``partition_concurrency``
  (default 1 with a strategy other than ``wait``), decided when the start is made
  (``kenning/storage/strategies.py``): ``wait`` (the default) waits for a slot;
  ``cancel_newest`` ends the new start at once as cancelled (``StartedInstance.cancelled``);
  ``cancel_in_progress`` asks the key's oldest unfinished instance to cancel (its
  compensations run) and starts the new one; ``singleton`` returns the key's unfinished
  instance instead (``created=False``). For these, an instance holds its key from its start
  to its end (waiting for an event or a timer included), not only while leased;
- ``partition_rate_limit=RateLimit(limit, period, key=...)``: at most ``limit`` starts per
  ``period`` seconds for each partition key (``kenning/flow.py``).

"Held" means leased: running in a worker now. An instance waiting for an event or a timer
holds no slot (it needs no worker); its lease expiring (a crashed worker) frees its slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from kenning.core.limits import MAX_ID_LENGTH
from kenning.errors import ConfigurationError
from kenning.flow import RateLimit

# The largest value an integer column holds: limits and priorities beyond are refused here.
_MAX_INT = 2**31 - 1

PartitionStrategy = Literal["wait", "cancel_newest", "cancel_in_progress", "singleton"]
PARTITION_STRATEGIES: tuple[str, ...] = get_args(PartitionStrategy)


@dataclass(frozen=True)
class Queue:
    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None
    partition_concurrency: int | None = None
    partition_strategy: PartitionStrategy = "wait"
    partition_rate_limit: RateLimit | None = None

    def __post_init__(self) -> None:
        check_queue_name(self.name)
        if self.partition_strategy not in PARTITION_STRATEGIES:
            raise ConfigurationError(
                f"queue {self.name!r}: partition_strategy= must be one of {', '.join(PARTITION_STRATEGIES)}, "
                f"got {self.partition_strategy!r}"
            )
        if self.partition_strategy == "singleton" and self.partition_concurrency not in (None, 1):
            raise ConfigurationError(f"queue {self.name!r}: a singleton key runs one instance: partition_concurrency=1")
        if self.partition_rate_limit is not None and not isinstance(self.partition_rate_limit, RateLimit):
            raise ConfigurationError(f"queue {self.name!r}: partition_rate_limit= must be a kenning.RateLimit")
        for what in ("concurrency", "worker_concurrency", "partition_concurrency"):
            value = getattr(self, what)
            if value is not None and (type(value) is not int or not 0 < value <= _MAX_INT):
                raise ConfigurationError(f"queue {self.name!r}: {what}= must be a positive int, got {value!r}")
        if self.rate_limit is not None:
            try:
                count, period = self.rate_limit
            except (TypeError, ValueError):
                raise ConfigurationError(
                    f"queue {self.name!r}: rate_limit= must be (starts, seconds), got {self.rate_limit!r}"
                ) from None
            if type(count) is not int or not 0 < count <= _MAX_INT:
                raise ConfigurationError(f"queue {self.name!r}: rate_limit's starts must be a positive int")
            if not isinstance(period, int | float) or not math.isfinite(period) or period <= 0:
                raise ConfigurationError(f"queue {self.name!r}: rate_limit's seconds must be a positive number")
        from kenning.registry import REGISTRY  # the registry imports workflows, which name queues

        REGISTRY.add_queue(self)

    @property
    def key_limit(self) -> int | None:
        """The per-key limit the claim enforces: a strategy other than ``wait`` implies 1."""
        if self.partition_concurrency is None and self.partition_strategy != "wait":
            return 1
        return self.partition_concurrency

    @property
    def rate_count(self) -> int | None:
        return None if self.rate_limit is None else self.rate_limit[0]

    @property
    def rate_period_seconds(self) -> float | None:
        return None if self.rate_limit is None else float(self.rate_limit[1])


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_ID_LENGTH or "\x00" in name:
        raise ConfigurationError(f"a queue's name must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    return name


def check_priority(priority: object) -> int:
    if type(priority) is not int or not -_MAX_INT <= priority <= _MAX_INT:
        raise ValueError(f"priority must be an int between {-_MAX_INT} and {_MAX_INT}")
    return priority
