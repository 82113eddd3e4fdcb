"""Where a run, and a step's retries, come to rest."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kenning.context import StepScope
from kenning.engine.history import StepTiming
from kenning.engine.retries import GiveUpReason


class RunOutcome(enum.Enum):
    """Where a run came to rest."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"  # waiting (event, timer) or a retry back-off: the lease was given back
    LEASE_LOST = "lease_lost"  # another worker holds the instance: this run wrote nothing more
    CONTINUED = "continued"  # continue_as_new: the next run of the instance is ready, the lease kept


@dataclass(frozen=True)
class Attempted:
    """A step's attempt that succeeded: its result and the transaction to record it in."""

    result: Any
    step: StepScope
    # failed attempts were counted on the instance: the record clears them
    counted: bool
    timing: StepTiming


@dataclass(frozen=True)
class GaveUp:
    """A step whose retries are over: its last error and why."""

    error: Exception
    attempt: int
    reason: GiveUpReason
    counted: bool
    timing: StepTiming
