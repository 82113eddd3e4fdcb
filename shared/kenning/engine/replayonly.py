"""Replay only: run a workflow's code over an instance's recorded history and say where
new code would go on, or where it diverges, without running anything or writing anything.

``replay_only`` drives a ``WorkflowRun`` on a ``ReplayOnlyPort``: recorded steps return
their recorded results as on every replay; the first step that is not recorded stops the
replay before it starts (an activity's transaction is never opened, a wait never
registered, a patch marker never written), because that is where the instance would go on
under the new code. ``kenning replay-check`` runs it over the instances in the database.
No user hook runs (they may have effects), and the engine's own logs of the run stay quiet:
a divergence is this check's finding, not an engine error.
"""

from __future__ import annotations

import asyncio
import copy
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import structlog

from kenning import serialization
from kenning.context import StepScope
from kenning.core.records import TERMINAL_STATUSES, ClaimedInstance, CompensationRecord, HistoryRecord, SuspendOutcome
from kenning.engine.commands import (
    AttemptCounted,
    BeginCompensating,
    ChildStarted,
    CloseStream,
    Complete,
    ContinueAsNew,
    CountAttempt,
    DroppedCompensation,
    FailSaga,
    Finish,
    MessageSent,
    Publish,
    PublishValue,
    ReceiveMessage,
    RecordHeartbeat,
    RecordStep,
    ReleaseWithDelay,
    ReplyMessage,
    SaveCompensation,
    SendMessage,
    StartChild,
    Subscribe,
    Suspend,
    WaitChild,
    WriteStream,
)
from kenning.engine.history import REPLAYED_KINDS, compensation_step_id
from kenning.engine.run import WorkflowRun
from kenning.errors import NonDeterminismError

if TYPE_CHECKING:
    from datetime import datetime

    from kenning.app import App
    from kenning.core.streams import StreamEntry
    from kenning.workflow import Workflow


def _drop(*_: Any) -> NoReturn:
    raise structlog.DropEvent


# the engine's logger for replay-only runs: it drops every line
_QUIET = structlog.wrap_logger(None, processors=[_drop])


class Verdict(enum.Enum):
    GOES_ON = "goes on"  # replayed its history; the code's next step is a new one
    COMPLETED = "completed"  # replayed to the workflow's return (a finished instance)
    FAILED = "failed"  # replayed to the workflow raising (its recorded failure)
    DIVERGED = "diverged"  # the code no longer agrees with the history
    COMPENSATION_MISSING = "compensation missing"  # a saved compensation the code lacks

    @property
    def breaks(self) -> bool:
        """Whether deploying the code would break the instance."""
        return self in (Verdict.DIVERGED, Verdict.COMPENSATION_MISSING)


@dataclass(frozen=True)
class ReplayReport:
    """What replaying one instance found. For ``DIVERGED``: ``step_id`` is the first
    recorded step the code no longer reaches as recorded, ``recorded_name`` its recorded
    name, ``new_name`` what the code runs instead ("" when it returned). For ``GOES_ON``:
    ``new_step`` names the step it would go on with, when known."""

    verdict: Verdict
    replayed: int  # recorded steps replayed
    message: str = ""
    step_id: str = ""
    recorded_name: str = ""
    new_name: str = ""
    new_step: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "replayed": self.replayed,
            "message": self.message,
            "step_id": self.step_id or None,
            "recorded_name": self.recorded_name or None,
            "new_name": self.new_name if self.verdict is Verdict.DIVERGED else None,
            "new_step": self.new_step or None,
        }


class _ReachedNewStep(BaseException):
    """Stops the replay at the first step that is not recorded (never an ``Exception``:
    workflow code cannot catch it and go on)."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


class _Observer:
    """Stands in for the App's hooks: runs no user code, remembers the new activity the
    run is about to start (the hook precedes the attempt)."""

    def __init__(self) -> None:
        self.starting = ""

    async def on_activity_start(self, instance_id: str, step_id: str, *_: Any) -> None:
        self.starting = step_id


class ReplayOnlyPort:
    """An ``InstancePort`` that writes nothing: every command that would start or record
    something new stops the replay there."""

    def __init__(self, observer: _Observer) -> None:
        self._observer = observer

    @property
    def cancel_requested(self) -> bool:
        return False  # a cancel changes what runs next, not whether the history replays

    def _stop(self, step: str) -> NoReturn:
        raise _ReachedNewStep(step)

    def open_step(self) -> StepScope:
        self._stop(self._observer.starting or "a compensation")

    async def record_step(self, command: RecordStep, step: StepScope | None = None) -> None:
        self._stop(command.record.step_id)

    def save_compensation(self, command: SaveCompensation) -> None:
        pass  # registered again on replay: nothing to keep

    async def flush(self) -> None:
        pass

    def discard(self) -> None:
        pass

    async def count_attempt(self, command: CountAttempt) -> AttemptCounted:
        self._stop(command.step_id)

    async def record_heartbeat(self, command: RecordHeartbeat) -> bool:
        self._stop(command.step_id)

    async def deadline_passed(self) -> datetime | None:
        return None  # replayed code meets no deadline: it writes nothing

    async def release(self, command: ReleaseWithDelay) -> None:
        self._stop("a retry back-off")

    async def continue_as_new(self, command: ContinueAsNew) -> int | None:
        self._stop("continue_as_new")

    async def suspend(self, command: Suspend) -> SuspendOutcome:
        self._stop(command.step_id)

    async def start_child(self, command: StartChild) -> ChildStarted:
        self._stop(command.step_id)

    async def wait_child(self, command: WaitChild) -> HistoryRecord | SuspendOutcome:
        self._stop(command.step_id)

    async def complete(self, command: Complete) -> bool:
        self._stop("completion")

    async def begin_compensating(self, command: BeginCompensating) -> list[DroppedCompensation]:
        self._stop("compensation")

    async def finish(self, command: Finish | FailSaga) -> None:
        self._stop("the end")

    async def send_message(self, command: SendMessage) -> MessageSent:
        self._stop(command.record.step_id)

    async def subscribe(self, command: Subscribe) -> None:
        self._stop(command.record.step_id)

    async def publish(self, command: Publish) -> int:
        self._stop(command.record.step_id)

    async def receive_message(self, command: ReceiveMessage) -> HistoryRecord | SuspendOutcome:
        self._stop(command.step_id)

    async def reply_message(self, command: ReplyMessage) -> bool:
        self._stop(command.record.step_id)

    async def publish_value(self, command: PublishValue) -> None:
        self._stop(command.record.step_id)

    async def write_stream(self, command: WriteStream) -> StreamEntry:
        self._stop(command.record.step_id if command.record else f"a write to stream {command.key!r}")

    async def close_stream(self, command: CloseStream) -> None:
        self._stop(command.record.step_id if command.record else f"a close of stream {command.key!r}")


async def replay_only(
    app: App,
    workflow: Workflow[Any],
    instance: ClaimedInstance,
    history: list[HistoryRecord],
    compensations: list[CompensationRecord],
) -> ReplayReport:
    """Replay ``instance``'s history on ``workflow``'s code (see the module docstring)."""
    observer = _Observer()
    quiet_app = copy.copy(app)
    quiet_app.hooks = observer
    run = WorkflowRun(
        app=quiet_app,
        workflow=workflow,
        claimed=instance,
        history=history,
        compensations=compensations,
        port=ReplayOnlyPort(observer),
        inline_retry_seconds=0.0,
    )
    run.log = _QUIET
    recorded = sum(1 for r in history if r.kind in REPLAYED_KINDS)
    in_flight = instance.status not in TERMINAL_STATUSES
    missing = _missing_compensation(app, history, compensations) if in_flight else None
    before = asyncio.all_tasks()
    try:
        report = await _replay(run, recorded)
    finally:
        await _cancel_leftovers(before)
    if missing is not None and not report.verdict.breaks:
        return ReplayReport(Verdict.COMPENSATION_MISSING, report.replayed, missing)
    return report


async def _replay(run: WorkflowRun, recorded: int) -> ReplayReport:
    """``WorkflowRun.run``'s workflow part, each way it can end turned into a report."""
    run.barrier.enter(asyncio.current_task())

    def replayed() -> int:
        return recorded - len(run.cursor.unconsumed)

    try:
        kwargs = serialization.bind_arguments(run.workflow.func, run.claimed.input)
        await run.workflow.func(run.ctx, **kwargs)
        if run.cursor.unconsumed:
            raise run.cursor.returned_error()
    except _ReachedNewStep as stop:
        return ReplayReport(Verdict.GOES_ON, replayed(), new_step=stop.step)
    except NonDeterminismError as error:
        return ReplayReport(
            Verdict.DIVERGED,
            replayed(),
            str(error),
            step_id=error.step_id,
            recorded_name=error.recorded_name,
            new_name=error.new_name,
        )
    except Exception as error:  # the workflow raised: its recorded failure, replayed
        return ReplayReport(Verdict.FAILED, replayed(), f"{type(error).__name__}: {error}")
    return ReplayReport(Verdict.COMPLETED, replayed())


def _missing_compensation(
    app: App, history: list[HistoryRecord], compensations: list[CompensationRecord]
) -> str | None:
    """A saved compensation still to run that the code no longer has: the saga of this
    instance could not be undone after the deploy."""
    done = {r.step_id for r in history}
    for comp in compensations:
        if compensation_step_id(comp.comp_id) in done or app.registry.compensation(comp.function_name) is not None:
            continue
        return f"saved compensation {comp.function_name} ({comp.comp_id}) is not in the new code"
    return None


async def _cancel_leftovers(before: set[asyncio.Task[Any]]) -> None:
    """Branches the stopped run left behind (a sibling parked at a new step, say) are
    cancelled, so no task outlives its replay."""
    leftovers = [t for t in asyncio.all_tasks() - before if not t.done()]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)
