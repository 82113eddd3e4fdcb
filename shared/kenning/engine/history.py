"""An instance's history as replay reads it: step ids, the cursor over recorded steps and
the determinism checks.

A step's id is ``<name>:<n>`` (the n-th call of that name in this run) unless the code
gives one explicitly; the same code therefore asks for the same ids in every run, and a
recorded id asked for under another name means the code changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kenning.core.names import (
    ACTIVITY_COMPLETED,
    ACTIVITY_FAILED,
    CHANNEL_SUBSCRIBED,
    CHILD_STARTED,
    COMPENSATION_EXECUTED,
    COMPENSATION_FAILED,
    COMPENSATION_SKIPPED,
    EVENT_RECEIVED,
    EVENT_TIMEOUT,
    MESSAGE_RECEIVED,
    MESSAGE_REPLIED,
    MESSAGE_SENT,
    MESSAGE_TIMEOUT,
    PATCH_MARKER,
    STREAM_CLOSED,
    STREAM_WRITTEN,
    TIMER_EXPIRED,
    VALUE_PUBLISHED,
)
from kenning.core.records import HistoryRecord
from kenning.errors import NonDeterminismError

# Kinds the workflow body consumes on replay; compensation records are not among them.
REPLAYED_KINDS = frozenset(
    {ACTIVITY_COMPLETED, ACTIVITY_FAILED, EVENT_RECEIVED, EVENT_TIMEOUT, TIMER_EXPIRED, CHILD_STARTED}
)
COMPENSATION_KINDS = frozenset({COMPENSATION_EXECUTED, COMPENSATION_FAILED, COMPENSATION_SKIPPED})
# a send_message or publish, a receive (its message or its timeout) and a subscribe replay as steps too
REPLAYED_KINDS = REPLAYED_KINDS | {MESSAGE_SENT, MESSAGE_RECEIVED, MESSAGE_TIMEOUT, CHANNEL_SUBSCRIBED}
# a reply to a request (Client.request); publish_value, set_status
REPLAYED_KINDS = REPLAYED_KINDS | {MESSAGE_REPLIED, VALUE_PUBLISHED}
# write_stream, close_stream from workflow code
REPLAYED_KINDS = REPLAYED_KINDS | {STREAM_WRITTEN, STREAM_CLOSED}
COMPENSATION_STEP_PREFIX = "compensation:"
PATCH_STEP_PREFIX = "patch:"


def compensation_step_id(comp_id: str) -> str:
    """The history step id (and attempt-counter key) of one compensation."""
    return f"{COMPENSATION_STEP_PREFIX}{comp_id}"


@dataclass(frozen=True)
class StepTiming:
    """How a step that ran got its outcome: its attempt number (the failed attempts
    counted on the instance, earlier claims' too, plus this last one; an attempt cut
    short by a crash or a lost lease was never counted), and the last attempt's start
    (``time.time()``: seconds since the epoch on the worker's wall clock) and run time
    (monotonic clock, seconds).

    The start travels as a float, not a ``datetime``, because this is on every step's
    path: ``datetime.now(UTC).isoformat()`` cost a 2-worker throughput run about 6% of
    its workflows/s; the step insert turns the float into a ``timestamptz``."""

    attempts: int
    started_epoch: float
    seconds: float

    def as_json(self) -> dict[str, Any]:
        """The history row's columns (migration 0007), as the step insert reads them."""
        return {"attempts": self.attempts, "started_epoch": self.started_epoch, "run_seconds": self.seconds}


@dataclass(frozen=True)
class StepRecord:
    """One history row the engine asks the port to record."""

    step_id: str
    kind: str
    step_name: str
    payload: Any
    payload_bytes: bytes | None = None
    # the step had failed attempts counted on the instance: the record clears them
    clear_attempts: bool = False
    # a step that ran (an activity, a compensation): how often, and its last attempt's time
    timing: StepTiming | None = None

    @property
    def foldable(self) -> bool:
        """Whether a folding statement can carry it (bytes and attempt resets cannot)."""
        return self.payload_bytes is None and not self.clear_attempts

    def as_json(self) -> dict[str, Any]:
        """As the storage's step insert reads it (``kenning.storage.fencing.step_json``)."""
        step = {"step_id": self.step_id, "kind": self.kind, "step_name": self.step_name, "payload": self.payload}
        if self.timing is not None:
            step.update(self.timing.as_json())
        return step


class HistoryCursor:
    """Hands out step ids and the recorded step for each; knows what is still unreplayed."""

    # ctx.patched's decisions in this run, by patch id; made on first use, so a run that
    # never calls it pays nothing
    _patches: dict[str, bool] | None = None

    def __init__(self, *, instance_id: str, workflow_name: str, history: Iterable[HistoryRecord]) -> None:
        self.instance_id = instance_id
        self.workflow_name = workflow_name
        self.records = {record.step_id: record for record in history}
        self.unconsumed = {r.step_id for r in self.records.values() if r.kind in REPLAYED_KINDS}
        self._counters: dict[str, int] = {}
        # called when the last recorded step has been replayed (the replay barrier's cue)
        self.on_drained: Callable[[], None] | None = None

    @property
    def is_replaying(self) -> bool:
        return bool(self.unconsumed)

    @property
    def empty(self) -> bool:
        return not self.records

    def next_step_id(self, name: str) -> str:
        n = self._counters.get(name, 0) + 1
        self._counters[name] = n
        return f"{name}:{n}"

    def take(self, step_id: str, step_name: str) -> HistoryRecord | None:
        """The recorded step with this id, checked against the name now asking for it."""
        record = self.records.get(step_id)
        if record is None or record.kind not in REPLAYED_KINDS:
            return None
        if record.step_name != step_name:
            raise NonDeterminismError(
                f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
                f"step {step_id!r} was recorded as {record.step_name!r} but the code now runs "
                f"{step_name!r}; restore the old code path or start a new instance",
                step_id=step_id,
                recorded_name=record.step_name,
                new_name=step_name,
            )
        if step_id in self.unconsumed:
            self.unconsumed.discard(step_id)
            if not self.unconsumed and self.on_drained is not None:
                self.on_drained()
        return record

    def compensations_done(self) -> set[str]:
        """Step ids of compensations already run (executed or failed for good)."""
        return {s for s, r in self.records.items() if r.kind in COMPENSATION_KINDS}

    def new_step_error(self, step_id: str, step_name: str) -> NonDeterminismError:
        """The error for a new step asked for while recorded steps were never reached."""
        waiting = [s for s in self.records if s in self.unconsumed]  # history order, oldest first
        return NonDeterminismError(
            f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
            f"the code now runs new step {step_id!r} ({step_name}) while recorded step(s) "
            f"{', '.join(repr(s) for s in waiting[:5])} were never reached",
            **self._first_unreached(waiting),
            new_name=step_name,
        )

    def returned_error(self) -> NonDeterminismError:
        """The error for a workflow that returned with recorded steps never reached."""
        return NonDeterminismError(
            f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
            f"it returned while recorded step(s) {', '.join(sorted(self.unconsumed)[:5])} were never reached",
            **self._first_unreached([s for s in self.records if s in self.unconsumed]),
        )

    def _first_unreached(self, waiting: list[str]) -> dict[str, str]:
        """The oldest recorded step the code never reached, for ``NonDeterminismError``."""
        if not waiting:
            return {}
        return {"step_id": waiting[0], "recorded_name": self.records[waiting[0]].step_name}

    def patch_taken(self, patch_id: str) -> tuple[bool, str | None]:
        """``ctx.patched``'s decision, made once per run: (new path taken, the step id of a
        marker to record or None). History with the patch's marker took the new path; recorded
        steps still to replay without it mean the instance went past this point on the old
        code; with nothing recorded beyond this point the instance takes the new path, and
        the marker is recorded so that its replays agree."""
        if self._patches is None:
            self._patches = {}
        taken = self._patches.get(patch_id)
        if taken is not None:
            return taken, None
        step_id = f"{PATCH_STEP_PREFIX}{patch_id}"
        record = self.records.get(step_id)
        marked = record is not None and record.kind == PATCH_MARKER
        taken = marked or not self.unconsumed
        self._patches[patch_id] = taken
        return taken, step_id if taken and not marked else None
