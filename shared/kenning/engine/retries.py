"""Retry decisions, the same for activities and compensations.

Attempts are counted on the instance (``CountAttempt``), so a crash or a release does not
reset them and ``max_duration`` is measured from the first failure on the database clock.
A back-off up to ``inline_retry_seconds`` is slept in the run; a longer one releases the
instance, which is claimable again when the back-off ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kenning.errors import TerminalError
from kenning.retry import RetryPolicy


class GiveUpReason(enum.Enum):
    TERMINAL = "terminal"  # a TerminalError: recorded as is
    NOT_RETRYABLE = "not_retryable"  # the policy does not retry this error type
    EXHAUSTED = "exhausted"  # out of attempts or out of time


@dataclass(frozen=True)
class GiveUp:
    reason: GiveUpReason


@dataclass(frozen=True)
class RetryAfter:
    delay: float
    # the back-off is long: release the instance instead of holding the worker
    release: bool


def before_counting(policy: RetryPolicy, error: Exception, attempt: int) -> GiveUp | None:
    """What is decided without the count: an error never retried, or the last attempt."""
    if not policy.is_retryable(error):
        return GiveUp(GiveUpReason.TERMINAL if isinstance(error, TerminalError) else GiveUpReason.NOT_RETRYABLE)
    if policy.max_attempts is not None and attempt >= policy.max_attempts:
        return GiveUp(GiveUpReason.EXHAUSTED)
    return None


def after_counting(
    policy: RetryPolicy, attempt: int, seconds_since_first_failure: float, inline_retry_seconds: float
) -> GiveUp | RetryAfter:
    """Once the attempt is counted: out of time, or when to try again and how."""
    if policy.max_duration is not None and seconds_since_first_failure >= policy.max_duration:
        return GiveUp(GiveUpReason.EXHAUSTED)
    delay = policy.delay_after(attempt)
    return RetryAfter(delay=delay, release=delay > inline_retry_seconds)
