"""``WorkflowRun``: one run of a claimed instance, from the top, replaying recorded steps.

A recorded step returns its recorded result without running; the first unrecorded step
runs for real and the engine asks its ``InstancePort`` to record it. The run decides and
the port writes: this module does no I/O of its own (user code aside: activities,
compensations, hooks). It is the ``Runtime`` SDK functions talk to (``ctx.runtime``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import structlog

from kenning import codecs, serialization
from kenning.activity import call_attempt
from kenning.compensation import ON_FAILURE_PREFIX, on_failure_arguments
from kenning.context import (
    AttemptId,
    ChildOptions,
    StepScope,
    WorkflowContext,
    current_attempt,
    current_step,
    current_workflow,
)
from kenning.core.names import ACTIVITY_COMPLETED, ACTIVITY_FAILED, PATCH_MARKER
from kenning.core.records import ClaimedInstance, CompensationRecord, HistoryRecord, OutboxEvent, SuspendOutcome
from kenning.engine import children
from kenning.engine.barrier import ReplayBarrier
from kenning.engine.commands import (
    Complete,
    ContinueAsNew,
    CountAttempt,
    FinalStatus,
    Finish,
    RecordStep,
    ReleaseWithDelay,
    SaveCompensation,
    Suspend,
    SuspendOnEvent,
    SuspendOnTimer,
)
from kenning.engine.heartbeats import AttemptHeartbeat
from kenning.engine.history import HistoryCursor, StepRecord, StepTiming
from kenning.engine.messages import publish, receive_message, send_message, subscribe
from kenning.engine.messages import reply_message as _reply_message
from kenning.engine.outcomes import Attempted, GaveUp, RunOutcome
from kenning.engine.port import InstancePort
from kenning.engine.published import publish_value
from kenning.engine.retries import GiveUp, GiveUpReason, RetryAfter, after_counting, before_counting
from kenning.engine.saga import undo_saga
from kenning.engine.streams import close_stream, write_stream
from kenning.errors import (
    ActivityTimeoutError,
    CancelSeenBeforeWrite,
    ContinuedAsNew,
    HeartbeatTimeoutError,
    LeaseLostError,
    NonDeterminismError,
    RetryExhaustedError,
    StorageUnavailable,
    Suspended,
    UnstorableValueError,
    WorkflowCancelledException,
    WorkflowTimeoutError,
)
from kenning.hooks import call_hook
from kenning.objects import payloads
from kenning.observability import metrics, tracing
from kenning.observability.faults import fault_point
from kenning.registry import qualified_name
from kenning.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from kenning.starting import prepare_start

if TYPE_CHECKING:
    from datetime import datetime

    from kenning.activity import Activity
    from kenning.app import App
    from kenning.workflow import Workflow

T = TypeVar("T")
R = TypeVar("R")

# One proxy for every run: each run binds its ids onto the logger it assembled once. A
# proxy per run (get_logger in __init__) re-assembled the logger on every claim (a new
# PrintLogger, its file lock looked up, the processors wrapped): 8 % of the worker's CPU
# per bench workflow.
_log = structlog.get_logger("kenning.replay")


class WorkflowRun:
    """Runs one claimed instance until it completes, fails, suspends or loses its lease."""

    def __init__(
        self,
        *,
        app: App,
        workflow: Workflow[Any],
        claimed: ClaimedInstance,
        history: list[HistoryRecord],
        compensations: list[CompensationRecord],
        port: InstancePort,
        inline_retry_seconds: float,
        activity_timeout: float | None = None,
    ) -> None:
        self.app = app
        self.workflow = workflow
        self.claimed = claimed
        self.port = port
        self.cursor = HistoryCursor(instance_id=claimed.id, workflow_name=claimed.workflow_name, history=history)
        self.barrier = ReplayBarrier(lambda: not self.cursor.unconsumed)
        self.cursor.on_drained = self.barrier.drained
        self.compensations = list(compensations)
        # registrations made by this run's code, replayed ones included: a compensation
        # without an id is numbered by it. Not len(self.compensations): a cancel or a
        # saga's recovery loads the saved ones first, and the replay registering them
        # again must give them their old numbers, not new ones (they would run twice).
        self.registrations = 0
        self.cancelled = False
        self.inline_retry_seconds = inline_retry_seconds
        # the worker's --activity-timeout, for activities that declare none
        self.activity_timeout = activity_timeout
        self.ctx = WorkflowContext(self)
        # continue_as_new: the next run's input (JSON), once this run ended so
        self.continued_input: dict[str, Any] | None = None
        self.log = _log.bind(instance_id=claimed.id, workflow=claimed.workflow_name)

    # ---------------------------------------------------------------- the runtime interface

    @property
    def instance_id(self) -> str:
        return self.claimed.id

    @property
    def workflow_name(self) -> str:
        return self.claimed.workflow_name

    @property
    def is_replaying(self) -> bool:
        return self.cursor.is_replaying

    @property
    def cancel_requested(self) -> bool:
        return self.port.cancel_requested

    async def run_activity(
        self, act: Activity[Any], args: tuple[Any, ...], kwargs: dict[str, Any], activity_id: str | None
    ) -> Any:
        step_id = activity_id or self.cursor.next_step_id(act.name)
        record = self.cursor.take(step_id, act.name)
        if record is not None:
            if record.kind == ACTIVITY_FAILED:
                raise serialization.decode_error(record.payload)
            result = _decode_result(act, record)
            self._register_on_failure(act, step_id, args, kwargs, result)
            await self.hook("on_activity_complete", step_id, act.name, result, True)
            return result

        await self.before_new_step(step_id, act.name)
        policy = act.retry_policy or self.app.default_retry_policy or DEFAULT_RETRY_POLICY
        timeout = act.timeout if act.timeout is not None else self.activity_timeout
        # an entry on the instance (counted attempts, heartbeat details) is cleared with the record
        entry = self.claimed.attempts.get(step_id)
        carried = _Carried(entry.get("heartbeat_details") if isinstance(entry, dict) else None, entry is not None)

        async def attempt(_: StepScope) -> tuple[Any, Any, bytes | None]:
            heartbeat = AttemptHeartbeat(
                port=self.port,
                instance_id=self.instance_id,
                step_id=step_id,
                activity_name=act.name,
                previous=carried.details,
                timeout=act.heartbeat_timeout,
                is_async=act.is_async,
            )
            try:
                result = await heartbeat.watch(lambda: call_attempt(act, (self.ctx, *args), kwargs, timeout))
            finally:  # what the next attempt reads, and whether there is an entry to clear
                carried.details, carried.entry = heartbeat.latest_details, carried.entry or heartbeat.beaten
            payload, payload_bytes = await _off_the_loop(_encode_result, act, result)
            # its arguments are stored with the step record: checked here, so an
            # unstorable one is this attempt's failure
            self._register_on_failure(act, step_id, args, kwargs, result)
            return result, payload, payload_bytes

        outcome = await self.attempts(step_id, act.name, policy, attempt, activity=True, timeout=timeout)
        if isinstance(outcome, GaveUp):
            final = _activity_error(act.name, outcome)
            await self._record_failure(act.name, step_id, final, outcome.timing)
            raise final
        fault_point("activity.after_effect")
        result, payload, payload_bytes = outcome.result
        completed = StepRecord(
            step_id,
            ACTIVITY_COMPLETED,
            act.name,
            payload,
            payload_bytes,
            clear_attempts=outcome.counted or carried.entry,
            timing=outcome.timing,
        )
        try:
            await self.port.record_step(RecordStep(completed, what=f"step {step_id}"), outcome.step)
        except UnstorableValueError as error:  # its ctx.session writes were refused
            await self._record_failure(act.name, step_id, error, outcome.timing)
            raise
        self.log.debug("activity.completed", step=step_id)
        await self.hook("on_activity_complete", step_id, act.name, result, False)
        return result

    def register_compensation(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        activity_id: str | None,
        retry_policy: RetryPolicy | None = None,
        owner: str = "",
    ) -> None:
        """``owner`` prefixes the error naming an argument that cannot be stored."""
        self.registrations += 1
        position = self.registrations
        policy = retry_policy or getattr(func, "retry_policy", None)
        name = qualified_name(func)
        record = CompensationRecord(
            comp_id=activity_id or f"comp:{position}",
            position=position,
            function_name=name,
            args=serialization.storable_json(list(args), f"{owner}compensation {name} arguments"),
            kwargs=serialization.storable_json(kwargs, f"{owner}compensation {name} arguments"),
            retry_policy=policy.to_json() if isinstance(policy, RetryPolicy) else None,
        )
        if any(c.comp_id == record.comp_id for c in self.compensations):
            return  # replayed registration of one already saved
        self.compensations.append(record)
        self.port.save_compensation(SaveCompensation(record))

    async def wait_timer(
        self, step_name: str, timer_id: str | None, *, due_at: datetime | None, delay_seconds: float | None
    ) -> None:
        step_id = timer_id or self.cursor.next_step_id(step_name)
        if self.cursor.take(step_id, step_name) is not None:
            return
        await self.before_new_step(step_id, step_name, flush=False)
        await self._suspend(SuspendOnTimer(step_id, step_name, due_at, delay_seconds))

    async def wait_event(
        self,
        event_type: str,
        *,
        event_id: str | None,
        match: Any,
        since_at: datetime | None,
        since_seconds: float | None,
        timeout_seconds: float | None,
    ) -> HistoryRecord:
        """The recorded ``EventReceived`` or ``EventTimeout``; suspends until there is one.
        ``match`` is turned into JSON only for a new wait: a replay never reads it."""
        step_name = f"wait_event:{event_type}"
        step_id = event_id or self.cursor.next_step_id(f"wait_event_{event_type}")
        record = self.cursor.take(step_id, step_name)
        if record is not None:
            return record
        await self.before_new_step(step_id, step_name, flush=False)
        stored = serialization.to_json(match) if match is not None else None
        await self._suspend(
            SuspendOnEvent(step_id, step_name, event_type, stored, since_at, since_seconds, timeout_seconds)
        )

    async def start_child(
        self, workflow: Workflow[Any], arguments: dict[str, Any], options: ChildOptions
    ) -> tuple[str, str]:
        """(child id, start step id): ``kenning.engine.children.start_child``."""
        return await children.start_child(self, workflow, arguments, options)

    async def wait_child(self, start_step_id: str, child_id: str, workflow_name: str) -> HistoryRecord:
        """The child's recorded end: ``kenning.engine.children.wait_child``."""
        return await children.wait_child(self, start_step_id, child_id, workflow_name)

    async def send_message(self, instance_id: str, topic: str, data: Any, message_id: str | None) -> str:
        """The message's id: ``kenning.engine.messages.send_message``."""
        return await send_message(self, instance_id, topic, data, message_id)

    async def subscribe(self, channel: str) -> None:
        """``kenning.engine.messages.subscribe``."""
        await subscribe(self, channel)

    async def publish(self, channel: str, data: Any, message_id: str | None) -> int:
        """Subscribers reached: ``kenning.engine.messages.publish``."""
        return await publish(self, channel, data, message_id)

    async def receive_message(
        self, topic: str, *, receive_id: str | None, timeout_seconds: float | None
    ) -> HistoryRecord:
        """The recorded message or timeout: ``kenning.engine.messages.receive_message``."""
        return await receive_message(self, topic, receive_id=receive_id, timeout_seconds=timeout_seconds)

    async def reply_message(self, message_id: str, topic: str, value: Any, error: str | None) -> None:
        """``kenning.engine.messages.reply_message``."""
        await _reply_message(self, message_id, topic, value, error)

    async def publish_value(self, key: str, value: Any) -> None:
        """``kenning.engine.published.publish_value``."""
        await publish_value(self, key, value)

    async def write_stream(self, key: str, value: Any, publish: bool) -> int:
        """``kenning.engine.streams.write_stream``."""
        return await write_stream(self, key, value, publish)

    async def close_stream(self, key: str) -> None:
        """``kenning.engine.streams.close_stream``."""
        await close_stream(self, key)

    async def send_event(self, step: StepScope, event: OutboxEvent, data: Any) -> None:
        """Write ``event`` in the attempt's transaction; ``on_event_sent`` once it commits."""
        await step.add_outbox_event(event)
        self.log.debug("outbox.event_recorded", event_id=event.event_id, event_type=event.event_type)
        step.after_commit(lambda: self.hook("on_event_sent", event.event_type, event.source, data, with_id=False))

    async def patched(self, patch_id: str) -> bool:
        """``ctx.patched``: whether this instance takes the new code path (``HistoryCursor.
        patch_taken`` decides); the first new-path decision records the patch's marker,
        held back like a step record and folded into the next write."""
        if current_step.get() is not None:
            raise RuntimeError("ctx.patched belongs in workflow code, not in an activity or compensation")
        taken, marker = self.cursor.patch_taken(patch_id)
        if marker is not None:
            record = StepRecord(marker, PATCH_MARKER, patch_id, {})
            await self.port.record_step(RecordStep(record, what=f"patch {patch_id!r} marker"))
        return taken

    async def continue_as_new(self, new_input: dict[str, Any]) -> NoReturn:
        """``continue_as_new``: end this run at a step boundary and hand ``new_input``
        (checked as a start's) to the next one; ``run()`` makes it (``_continue``)."""
        if current_step.get() is not None:
            raise RuntimeError("continue_as_new belongs in workflow code, not in an activity or compensation")
        # history fully replayed (else the code diverged), no cancel requested (it wins)
        await self.barrier.wait(lambda: self.cursor.new_step_error("continue_as_new", "continue_as_new"))
        self.raise_if_cancelled()
        checked = prepare_start(
            self.workflow, new_input, instance_id=self.instance_id, own_ids=True, flow_control=False
        )
        raise ContinuedAsNew(checked.instance.input_json)

    # ---------------------------------------------------------------- step boundaries

    async def before_new_step(self, step_id: str, step_name: str, *, flush: bool = True) -> None:
        """Checks at every step boundary before anything new runs: history fully replayed
        (``ReplayBarrier``), the deferred record written (``flush=False`` keeps it for a
        suspend that folds it in), no cancellation requested."""
        await self.barrier.wait(lambda: self.cursor.new_step_error(step_id, step_name))
        if flush:
            await self.port.flush()
        self.raise_if_cancelled()

    async def folded(self, write: Awaitable[T]) -> T:
        """A port write that carries the held-back record (after ``before_new_step(...,
        flush=False)``): one commit where a flush and the write were two. A cancel that the
        record's write sees ends the step before its rows are written, as the flush and
        the check would have ended it (``CancelSeenBeforeWrite``)."""
        try:
            return await write
        except CancelSeenBeforeWrite:
            self.raise_if_cancelled()
            raise  # the port saw a cancel, so raise_if_cancelled has raised

    def raise_if_cancelled(self) -> None:
        if self.cancelled or self.port.cancel_requested:
            self.cancelled = True
            raise WorkflowCancelledException(f"workflow instance {self.instance_id} was cancelled")

    async def _suspend(self, command: Suspend) -> NoReturn:
        """Give the lease back while the instance waits. A cancel that races the suspend
        is applied, never overwritten (Edda 0.1.0 lost it)."""
        self.suspended(await self.port.suspend(command), command.step_id, command.step_name)

    def suspended(self, outcome: SuspendOutcome, step_id: str, step_name: str) -> NoReturn:
        """End the run as the suspend of ``step_id`` came out (every wait's, the child's
        and the receive's too): waiting, cancelled, or the lease lost."""
        if outcome is SuspendOutcome.SUSPENDED:
            tracing.suspended(step_id, step_name)
        if outcome is SuspendOutcome.CANCELLED:
            self.raise_if_cancelled()
        if outcome is SuspendOutcome.LEASE_LOST:
            raise LeaseLostError(f"lease on {self.instance_id} was lost before it could suspend")
        self.log.debug("instance.suspended")
        raise Suspended()

    # ---------------------------------------------------------------- the retry loop

    async def attempts(
        self,
        step_id: str,
        name: str,
        policy: RetryPolicy,
        attempt_once: Callable[[StepScope], Awaitable[T]],
        *,
        activity: bool,
        timeout: float | None = None,
    ) -> Attempted | GaveUp:
        """Run ``attempt_once`` until it succeeds or the policy gives up: the one retry
        loop of activities and compensations. Failed attempts are counted through the
        port; a long back-off releases the instance (``Suspended``). Only an activity's
        retry stops for a cancellation (compensations are what a cancel runs)."""
        attempt = int(self.claimed.attempts.get(step_id, {}).get("attempts", 0))
        counted = attempt > 0
        while True:
            attempt += 1
            if activity:
                await self.hook("on_activity_start", step_id, name, False)
            step = self.port.open_step()
            token = current_step.set(step)
            attempt_token = current_attempt.set(AttemptId(step_id, attempt))
            monotonic_start, wall_start = time.perf_counter(), time.time()
            span = tracing.start_attempt(step_id, name, attempt, activity=activity)
            try:
                result = await attempt_once(step)
            except codecs.CodecError as error:  # this process's keys, not the attempt: no attempt counted
                tracing.end_attempt(span, error)
                await step.rollback()
                raise
            except Exception as error:
                # the attempt's time, not the rollback's, the hook's or the counting's after it
                timing = StepTiming(attempt, wall_start, time.perf_counter() - monotonic_start)
                tracing.end_attempt(span, error)
                metrics.STEP_DURATION.labels(self.workflow_name, name, "failed").observe(timing.seconds)
                await step.rollback()
                if isinstance(error, HeartbeatTimeoutError):
                    self.log.warning("activity.heartbeat_timed_out", step=step_id, attempt=attempt, error=str(error))
                elif isinstance(error, ActivityTimeoutError):
                    self.log.warning("activity.timed_out", step=step_id, attempt=attempt, timeout=timeout)
                if activity:
                    await self.hook("on_activity_failed", step_id, name, error)
                verdict: GiveUp | RetryAfter | None = before_counting(policy, error, attempt)
                if verdict is None:
                    count = CountAttempt(step_id, attempt, codecs.seal(serialization.storable_text(repr(error))[:2000]))
                    counted = True
                    answer = await self.port.count_attempt(count)
                    verdict = after_counting(
                        policy, attempt, answer.seconds_since_first_failure, self.inline_retry_seconds
                    )
                if isinstance(verdict, GiveUp):
                    return GaveUp(error, attempt, verdict.reason, counted, timing)
                metrics.STEP_RETRIES.labels(self.workflow_name, name).inc()
                if activity:
                    self.raise_if_cancelled()
                if verdict.release:
                    # A long back-off frees the worker: the instance becomes claimable again later.
                    await self.port.release(ReleaseWithDelay(verdict.delay))
                    self.log.info("activity.retry_scheduled", step=step_id, attempt=attempt, delay=verdict.delay)
                    raise Suspended() from None
                await self.hook("on_activity_retry", step_id, name, attempt, verdict.delay)
                self.log.info("activity.retry", step=step_id, attempt=attempt, delay=verdict.delay, error=repr(error))
                await asyncio.sleep(verdict.delay)
                continue
            except BaseException as error:
                tracing.end_attempt(span, error)
                await step.rollback()
                raise
            finally:
                current_attempt.reset(attempt_token)
                current_step.reset(token)
            tracing.end_attempt(span)
            timing = StepTiming(attempt, wall_start, time.perf_counter() - monotonic_start)
            metrics.STEP_DURATION.labels(self.workflow_name, name, "completed").observe(timing.seconds)
            return Attempted(result, step, counted, timing)

    async def _record_failure(
        self, name: str, step_id: str, error: BaseException, timing: StepTiming | None = None
    ) -> None:
        record = StepRecord(
            step_id, ACTIVITY_FAILED, name, serialization.encode_error(error), clear_attempts=True, timing=timing
        )
        await self.port.record_step(RecordStep(record, defer=False, what=f"step {step_id}"))

    def _register_on_failure(
        self, act: Activity[Any], step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        comp = act.on_failure
        if comp is None:
            return
        # Edda's call, by name: the activity's arguments by parameter name merged with its
        # dict result; the compensation takes the names it declares when it runs.
        named = on_failure_arguments(act.func, comp, args, kwargs, result)
        self.register_compensation(
            comp, (), named, f"{ON_FAILURE_PREFIX}{step_id}", act.retry_policy, owner=f"activity {act.name}: "
        )

    async def hook(self, name: str, *args: Any, with_id: bool = True) -> None:
        """A user hook (``WorkflowHooks``), with the instance id first unless told not to."""
        await call_hook(self.app.hooks, name, *((self.instance_id, *args) if with_id else args))

    # ---------------------------------------------------------------- the whole run

    async def run(self) -> RunOutcome:
        """Run to the next resting point. A payload this process cannot open (``CodecError``:
        a key it lacks) raises out of it, nothing written: the worker's keys are wrong, not
        the workflow, so nothing is failed or compensated."""
        if self.claimed.unreadable is not None:
            raise codecs.CodecError(self.claimed.unreadable)
        self.barrier.enter(asyncio.current_task())
        if self.claimed.status == "compensating" or (self.port.cancel_requested and self.cursor.empty):
            # Crash recovery of a saga (or its retry back-off), or a cancel that arrived
            # before the first step: nothing of the workflow body needs to run again.
            return await self._undo(error=None, cancelled=self.port.cancel_requested)
        try:
            kwargs = serialization.bind_arguments(self.workflow.func, self.claimed.input)
            if self.claimed.run_count == 1:
                await self.hook("on_workflow_start", self.workflow_name, self.claimed.input)
            running = current_workflow.set(self.ctx)
            try:
                result = await self.workflow.func(self.ctx, **kwargs)
            finally:
                current_workflow.reset(running)
            if self.cursor.unconsumed:
                raise self.cursor.returned_error()
        except Suspended:
            try:
                await self.port.flush()
            except LeaseLostError:  # a control signal escaping run() would end its task unseen
                self.log.warning("instance.lease_lost")
                return RunOutcome.LEASE_LOST
            return RunOutcome.SUSPENDED
        except LeaseLostError:
            self.port.discard()
            self.log.warning("instance.lease_lost")
            return RunOutcome.LEASE_LOST
        except ContinuedAsNew as signal:
            return await self._continue(signal.input)
        except (StorageUnavailable, codecs.CodecError):
            self.port.discard()
            raise
        except NonDeterminismError as error:
            self.port.discard()
            self.log.error("instance.non_deterministic", error=str(error))
            metrics.NON_DETERMINISM_ERRORS.labels(self.workflow_name).inc()
            return await self._finish_without_compensation(error)
        except Exception as error:
            if self.cancelled:
                return await self._undo(error=None, cancelled=True)
            return await self._fail(error)
        except asyncio.CancelledError:
            self.port.discard()
            raise
        if self.cancelled:
            return await self._undo(error=None, cancelled=True)
        return await self._complete(result)

    async def _fail(self, error: Exception) -> RunOutcome:
        """The workflow's error: its saga is undone and the instance ends failed."""
        # Log levels: a workflow that raised is the workflow's outcome, handled as
        # designed (its saga is undone), so a warning; error is kept for what needs an
        # operator: non-determinism (a code fix) and a compensation that failed for good
        # (a saga left half done).
        self.log.warning("instance.failed", error=repr(error))
        return await self._undo(error=error, cancelled=False)

    async def _undo(self, *, error: BaseException | None, cancelled: bool) -> RunOutcome:
        try:
            if cancelled:
                # the scheduler's cancel at the workflow timeout: compensated the same, but
                # the instance ends failed with WorkflowTimeoutError (read once, on this path only)
                deadline = await self.port.deadline_passed()
                if deadline is not None:
                    self.log.warning("instance.timed_out", deadline=deadline.isoformat())
                    error = WorkflowTimeoutError(
                        f"workflow {self.workflow_name} timed out: its deadline {deadline.isoformat()} passed"
                    )
                    cancelled = False
            return await undo_saga(self, error=error, cancelled=cancelled)
        except Suspended:  # a compensation's retry back-off released the instance
            return RunOutcome.SUSPENDED
        except LeaseLostError:
            self.port.discard()
            self.log.warning("instance.lease_lost")
            return RunOutcome.LEASE_LOST

    async def _continue(self, new_input: dict[str, Any]) -> RunOutcome:
        """End this run and make the next one (``ContinueAsNew``); a cancel requested
        meanwhile wins: nothing is written and the instance is compensated as cancelled."""
        try:
            run = await self.port.continue_as_new(ContinueAsNew(new_input))
        except UnstorableValueError as error:
            return await self._fail(error)
        except LeaseLostError:
            self.port.discard()
            self.log.warning("instance.lease_lost")
            return RunOutcome.LEASE_LOST
        if run is None:
            self.cancelled = True
            return await self._undo(error=None, cancelled=True)
        self.continued_input = new_input
        self.log.info("instance.continued_as_new", run=run)
        return RunOutcome.CONTINUED

    async def _complete(self, result: Any) -> RunOutcome:
        # A result that cannot be stored is the workflow's error (its saga is undone),
        # decided before the write: written, it would be refused on every replay.
        try:
            what = f"workflow {self.workflow_name}: result"
            payload = {"result": await _off_the_loop(serialization.storable_json, result, what)}
            completed = await self.port.complete(Complete(payload, what=f"workflow {self.workflow_name}: completion"))
        except UnstorableValueError as error:
            return await self._fail(error)
        except LeaseLostError:
            self.log.warning("instance.lease_lost")
            return RunOutcome.LEASE_LOST
        if not completed:  # a cancel committed during the last step: it is honoured
            self.cancelled = True
            return await self._undo(error=None, cancelled=True)
        self.log.debug("instance.completed")
        await self.hook("on_workflow_complete", self.workflow_name, result)
        return RunOutcome.COMPLETED

    async def _finish_without_compensation(self, error: BaseException) -> RunOutcome:
        finish = Finish(FinalStatus.FAILED, serialization.encode_error(error))
        try:
            try:
                await self.port.finish(finish)
            except UnstorableValueError:  # the deferred record was refused and dropped; the error is storable
                await self.port.finish(finish)
        except LeaseLostError:
            self.log.warning("instance.lease_lost")
            return RunOutcome.LEASE_LOST
        await self.hook("on_workflow_failed", self.workflow_name, error)
        return RunOutcome.FAILED


@dataclass
class _Carried:
    """What one attempt of an activity leaves the next: its last heartbeat details, and
    whether the step has an entry on the instance (cleared when the step is recorded)."""

    details: Any
    entry: bool


def _activity_error(name: str, gave_up: GaveUp) -> BaseException:
    """What the workflow sees (and history keeps) of an activity whose retries are over."""
    error = gave_up.error
    if gave_up.reason is GiveUpReason.TERMINAL:
        return error
    if gave_up.reason is GiveUpReason.NOT_RETRYABLE:
        final = RetryExhaustedError(f"Activity {name} failed: error type {type(error).__name__} is not retryable")
    else:
        final = RetryExhaustedError(f"Activity {name} failed after {gave_up.attempt} attempts: {error}")
    final.__cause__ = error
    return final


async def _off_the_loop(seal: Callable[..., R], *args: Any) -> R:
    """``seal(*args)``, in a thread when values may go to the object store: a large
    result's encoding and upload (seconds at 100 MB) would otherwise hold the worker's
    event loop, and with it every other instance's steps, heartbeats and lease renewals
    on that worker. ``to_thread`` copies the context, so the value's owner goes along."""
    if not payloads.enabled():
        return seal(*args)
    return await asyncio.to_thread(seal, *args)


def _encode_result(act: Activity[Any], result: Any) -> tuple[Any, bytes | None]:
    if isinstance(result, bytes | bytearray | memoryview):
        sealed = codecs.seal_bytes(bytes(result))
        if sealed is None:
            return {"bytes": True}, bytes(result)
        return {"bytes": True, "data": sealed}, b""  # an empty payload_bytes: the sign of sealed bytes
    return {"result": serialization.storable_json(result, f"activity {act.name}: result")}, None


def _decode_result(act: Activity[Any], record: HistoryRecord) -> Any:
    if record.payload_bytes is not None:  # sealed in the payload (opened or not), or as it came
        data = (record.payload or {}).get("data")
        return codecs.unseal_bytes(data) if data is not None else record.payload_bytes
    annotation = serialization.type_hints(act.func).get("return", inspect.Parameter.empty)
    return serialization.from_json((record.payload or {}).get("result"), annotation)
