"""Flow control per key for keyed bursts of starts: ``Debounce``, ``Batch`` and ``RateLimit``.

- ``@workflow(debounce=Debounce(key="document_id", period=5, max_wait=60))``: starts of the
  workflow with the same key arriving within ``period`` seconds of each other become one
  instance, which runs once the key has been quiet for ``period`` (or ``max_wait`` after the
  burst's first start) with the last start's input. Every start returns the id of the
  instance it joined (``created`` is True for the burst's first start only).
- ``@workflow(event_handler=True, batch=Batch(max_size=100, max_wait=2, key="tenant"))``: the
  CloudEvents of the workflow's type are gathered per key; one instance per batch receives
  their data as its ``events`` parameter, a list in arrival order, and runs once the batch
  is full or ``max_wait`` after its first event.

- ``Queue("emails", partition_rate_limit=RateLimit(limit=10, period=60, key="customer"))``:
  at most ``limit`` starts per ``period`` seconds for each partition key of a queue. Each key
  gets its own window, which the queued claim enforces in the database
  (``kenning/storage/claims.py``) the way it enforces the queue's own ``rate_limit``. A
  start counts when it is first claimed (``started_at``), so a key's instances over its
  limit wait durably in the queue (they do not fail): the claim moves their due time to
  when the key's window frees, and serves the other keys meanwhile. ``key`` names an input
  field whose value is the start's partition key when the start gives none
  (``partition_key=`` wins); without ``key``, the partition key alone says.

A key is a field of the input (a start's arguments, an event's data) or a function of it.
The accepted start or event and its place in a burst or batch commit in one transaction
(``kenning/storage/flow.py``), so none is lost or counted twice; the burst's or batch's
instance is an ordinary ``pending`` row whose run-after time is the burst's due time, so
the worker's claim releases it, waking at that time (docs/workflows.md, "Flow control").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kenning.core.limits import MAX_ID_LENGTH
from kenning.errors import ConfigurationError

# A key: the name of an input field, or a function of the input (its arguments by name).
KeyOf = str | Callable[[Mapping[str, Any]], Any]

# The parameter of a batch workflow that receives the batch's events.
BATCH_PARAMETER = "events"


def _positive_seconds(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def _check_key(what: str, key: object) -> None:
    if not (isinstance(key, str) and key) and not callable(key):
        raise ConfigurationError(f"{what}: key= must be an input field's name or a function of the input")


def key_value(key: KeyOf | None, data: Mapping[str, Any], what: str) -> str:
    """The key of one start or event: its ``key`` field, or ``key(data)``, as text; raises
    ``ValueError`` naming what is missing (the caller's input lacks the field)."""
    if key is None:
        return ""
    if isinstance(key, str):
        if key not in data:
            raise ValueError(f"{what} key field {key!r} is not in the input")
        value = data[key]
    else:
        value = key(data)
    if value is None:
        raise ValueError(f"{what} key is None")
    text = value if isinstance(value, str) else str(value)
    if "\x00" in text or len(text) > MAX_ID_LENGTH:
        raise ValueError(f"{what} key must be at most {MAX_ID_LENGTH} characters with no NUL character")
    return text


@dataclass(frozen=True)
class Debounce:
    """Starts with one key within ``period`` seconds of each other are one instance, run
    ``period`` after the last of them, or ``max_wait`` after the first (default: never
    forced), with the last start's input."""

    key: KeyOf
    period: float
    max_wait: float | None = None

    def __post_init__(self) -> None:
        _check_key("Debounce", self.key)
        object.__setattr__(self, "period", _positive_seconds("Debounce period=", self.period))
        if self.max_wait is not None:
            max_wait = _positive_seconds("Debounce max_wait=", self.max_wait)
            if max_wait < self.period:
                raise ConfigurationError(f"Debounce max_wait= ({max_wait}) must be at least period= ({self.period})")
            object.__setattr__(self, "max_wait", max_wait)

    def key_of(self, data: Mapping[str, Any]) -> str:
        return key_value(self.key, data, "debounce")


@dataclass(frozen=True)
class Batch:
    """An ``event_handler`` workflow's events gathered per ``key`` (default: one batch at a
    time for all) into batches of at most ``max_size``, each run ``max_wait`` seconds after
    its first event at the latest."""

    max_size: int
    max_wait: float
    key: KeyOf | None = None

    def __post_init__(self) -> None:
        if type(self.max_size) is not int or not 0 < self.max_size <= 100_000:
            raise ConfigurationError(f"Batch max_size= must be an int from 1 to 100000, got {self.max_size!r}")
        object.__setattr__(self, "max_wait", _positive_seconds("Batch max_wait=", self.max_wait))
        if self.key is not None:
            _check_key("Batch", self.key)

    def key_of(self, data: Mapping[str, Any]) -> str:
        return key_value(self.key, data, "batch")


@dataclass(frozen=True)
class DebouncedStart:
    """A start's place in its key's burst, for the insert (``kenning/storage/flow.py``)."""

    key: str
    period: float
    max_wait: float | None
    seq: int | None = None  # an event's start: its inbox row's id, recorded with the burst


@dataclass(frozen=True)
class BatchedEvent:
    """An event's place in its key's batch, for the append (``kenning/storage/flow.py``)."""

    key: str
    max_size: int
    max_wait: float
    seq: int  # its inbox row's id: the batch's events are ordered by it (arrival order)
    data: Any


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
