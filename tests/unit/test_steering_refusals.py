"""The operator actions' refusals (``kenning.commands.steering``): what the console offers
and what the commands refuse are one judgement. A saga whose compensations ran is not
retried unless one failed (then those run again) or it was parked as a crash loop; a skip
needs a compensation still to run, and on a failed instance one that failed; a second
cancel of an instance already asked to cancel is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kenning.commands import steering
from kenning.storage.claims import CRASH_LOOP
from kenning.storage.sagas import SagaState


@dataclass(frozen=True)
class Row:
    id: str = "i-1"
    status: str = "failed"
    cancel_requested: bool = False
    error: dict[str, Any] | None = None


UNDONE = SagaState(executed=2, failed=0, open=0)
STOPPED = SagaState(executed=1, failed=1, open=1)
NONE = SagaState(executed=0, failed=0, open=0)


def test_a_saga_that_compensated_is_not_retried_unless_a_compensation_failed_or_it_crash_looped() -> None:
    assert steering.saga_refusal("retry", Row(), UNDONE) == (
        "2 compensation(s) already undid its steps; start a new instance instead"
    )
    assert steering.saga_refusal("retry", Row(), STOPPED) is None
    assert steering.saga_refusal("retry", Row(), NONE) is None
    assert steering.saga_refusal("retry", Row(error={"reason": CRASH_LOOP}), UNDONE) is None


@pytest.mark.parametrize(
    ("row", "saga", "refused"),
    [
        (Row(status="compensating"), SagaState(0, 0, 2), None),
        (Row(status="compensating"), NONE, "it has no compensation still to run"),
        (Row(status="failed"), STOPPED, None),
        (Row(status="failed"), SagaState(0, 0, 1), "it failed in a step, not at a compensation"),
    ],
)
def test_a_skip_needs_a_compensation_to_skip(row: Row, saga: SagaState, refused: str | None) -> None:
    found = steering.saga_refusal("skip-compensation", row, saga)
    assert (found is None) == (refused is None) and (refused is None or refused in str(found))


def test_a_second_cancel_is_refused_whatever_the_status_it_met() -> None:
    for status in ("pending", "running", "compensating"):
        refused = steering.refusal("cancel", Row(status=status, cancel_requested=True))
        assert refused is not None and "already being cancelled" in refused
    assert steering.refusal("cancel", Row(status="pending")) is None
    # a crash-looped instance asked to cancel before it was parked resumes as a cancel
    assert steering.refusal("cancel", Row(cancel_requested=True, error={"reason": CRASH_LOOP})) is None
