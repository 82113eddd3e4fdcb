"""The replay engine: runs one claimed instance from the top, replaying recorded steps.

A recorded step returns its recorded result without running; the first unrecorded step
runs for real and is recorded with a fenced write. Commits are deferred to the next step
boundary, so a workflow's completion rides in the same commit as its last activity.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import structlog

from kenning import serialization
from kenning.activity import call_attempt
from kenning.compensation import ON_FAILURE_PREFIX, on_failure_arguments
from kenning.context import StepTransaction, WorkflowContext, current_step
from kenning.dberrors import is_data_error, is_unavailable
from kenning.errors import (
    ActivityTimeoutError,
    LeaseLostError,
    NonDeterminismError,
    RetryExhaustedError,
    TerminalError,
    UnstorableValueError,
    WorkflowCancelledException,
)
from kenning.faults import fault_point
from kenning.groupcommit import GroupCommit
from kenning.hooks import call_hook
from kenning.rawdb import Executor
from kenning.registry import qualified_name
from kenning.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage.records import (
    ClaimedInstance,
    CompensationRecord,
    FoldedWrites,
    HistoryRecord,
    SuspendOutcome,
)
from kenning.storage.writes import InstanceWrite

if TYPE_CHECKING:
    from kenning.activity import Activity
    from kenning.app import App
    from kenning.db import Database
    from kenning.workflow import Workflow

T = TypeVar("T")

ACTIVITY_COMPLETED = "ActivityCompleted"
ACTIVITY_FAILED = "ActivityFailed"
EVENT_RECEIVED = "EventReceived"
EVENT_TIMEOUT = "EventTimeout"
TIMER_EXPIRED = "TimerExpired"
COMPENSATION_EXECUTED = "CompensationExecuted"
COMPENSATION_FAILED = "CompensationFailed"
# Kinds the workflow body consumes on replay; compensation records are not among them.
REPLAYED_KINDS = frozenset({ACTIVITY_COMPLETED, ACTIVITY_FAILED, EVENT_RECEIVED, EVENT_TIMEOUT, TIMER_EXPIRED})


@dataclass(frozen=True)
class PendingRecord:
    """A step's history row, written at the next step boundary."""

    step_id: str
    kind: str
    step_name: str
    payload: Any
    payload_bytes: bytes | None = None
    clear_attempts: bool = False

    @property
    def foldable(self) -> bool:
        """Whether a folding statement can carry it (bytes and attempt resets cannot)."""
        return self.payload_bytes is None and not self.clear_attempts

    def as_json(self) -> dict[str, Any]:
        return {"step_id": self.step_id, "kind": self.kind, "step_name": self.step_name, "payload": self.payload}


class StorageUnavailable(BaseException):
    """Kenning could not write an instance's progress because the database is away.

    A BaseException, like ``Suspended``, so that workflow code cannot mistake it for its
    own failure: the run ends, nothing is compensated, and the worker releases the
    instance to be replayed once the database answers.
    """


class Suspended(BaseException):
    """The instance gave its lease back (waiting, or a durable retry back-off).

    A BaseException so that ``except Exception`` in user code cannot swallow it.
    """


class Replayer:
    """Runs one claimed instance until it completes, fails, suspends or loses its lease."""

    def __init__(
        self,
        *,
        db: Database,
        app: App,
        workflow: Workflow[Any],
        claimed: ClaimedInstance,
        history: list[HistoryRecord],
        compensations: list[CompensationRecord],
        inline_retry_seconds: float,
        writes: GroupCommit[InstanceWrite, bool | None],
        activity_timeout: float | None = None,
    ) -> None:
        self.db = db
        # the worker's group commit for step records and completions
        self.writes = writes
        self.app = app
        self.workflow = workflow
        self.claimed = claimed
        self.instance_id = claimed.id
        self.workflow_name = claimed.workflow_name
        self.token = claimed.lease_token
        self.history = {record.step_id: record for record in history}
        self.unconsumed = {r.step_id for r in history if r.kind in REPLAYED_KINDS}
        self.compensations = list(compensations)
        self.unsaved_compensations: list[CompensationRecord] = []
        self.counters: dict[str, int] = {}
        self.pending: PendingRecord | None = None
        self.write_lock = asyncio.Lock()
        self.cancel_requested = claimed.cancel_requested
        self.cancelled = False
        self.inline_retry_seconds = inline_retry_seconds
        # the worker's --activity-timeout, for activities that declare none
        self.activity_timeout = activity_timeout
        self.ctx = WorkflowContext(self)
        self.log = structlog.get_logger("kenning.replay").bind(instance_id=claimed.id, workflow=claimed.workflow_name)

    @property
    def is_replaying(self) -> bool:
        return bool(self.unconsumed)

    # ---------------------------------------------------------------- step ids and replay

    def next_step_id(self, name: str) -> str:
        n = self.counters.get(name, 0) + 1
        self.counters[name] = n
        return f"{name}:{n}"

    def take_recorded(self, step_id: str, step_name: str) -> HistoryRecord | None:
        """The recorded step with this id, checked against the name now asking for it."""
        record = self.history.get(step_id)
        if record is None or record.kind not in REPLAYED_KINDS:
            return None
        if record.step_name != step_name:
            raise NonDeterminismError(
                f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
                f"step {step_id!r} was recorded as {record.step_name!r} but the code now runs "
                f"{step_name!r}; restore the old code path or start a new instance"
            )
        self.unconsumed.discard(step_id)
        return record

    async def before_new_step(self, step_id: str, step_name: str, *, flush: bool = True) -> None:
        """Checks at every step boundary before anything new runs.

        Recorded steps still waiting to be replayed mean the code took another path than
        the one recorded. Concurrent branches (``asyncio.gather``) replay without real
        awaits, so yielding to the loop a few times lets siblings catch up first.
        ``flush=False`` keeps the deferred write open for a statement that folds into it
        (a suspend).
        """
        for _ in range(20):
            if not self.unconsumed:
                break
            await asyncio.sleep(0)
        if self.unconsumed:
            waiting = sorted(self.unconsumed, key=lambda s: self.history[s].created_at or 0)
            raise NonDeterminismError(
                f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
                f"the code now runs new step {step_id!r} ({step_name}) while recorded step(s) "
                f"{', '.join(repr(s) for s in waiting[:5])} were never reached"
            )
        if flush:
            await self.flush()
        self.raise_if_cancelled()

    def raise_if_cancelled(self) -> None:
        if self.cancelled or self.cancel_requested:
            self.cancelled = True
            raise WorkflowCancelledException(f"workflow instance {self.instance_id} was cancelled")

    # ---------------------------------------------------------------- writes
    #
    # A finished activity's record is kept in memory until the next step boundary and
    # written there in one autocommit statement (one round trip, one commit); when that
    # boundary is the workflow's return, the record and the completion are one statement.
    # An activity that opened a transaction (ctx.session, outbox) is recorded inside it.

    async def _autocommit(self, statement: Callable[[Executor], Awaitable[T]], what: str = "a write") -> T:
        async def run() -> T:
            async with self.db.autocommit.connect() as conn:
                return await statement(conn)

        return await self._storage(run(), what)

    async def _storage(self, write: Awaitable[T], what: str = "a write") -> T:
        """Await one of Kenning's own writes. The database being away is not the
        workflow's failure: it is raised as ``StorageUnavailable``, which workflow code
        cannot catch, and the worker hands the instance back to be run again.

        A value the database refuses (SQLSTATE class 22) would be refused again on every
        replay: that is the step's error, ``UnstorableValueError``, and the deferred record
        that rode along is dropped. Values are checked before they get here
        (``serialization.storable_json``); this is the guard for what the check missed."""
        try:
            return await write
        except Exception as error:
            if is_unavailable(error):
                raise StorageUnavailable(f"database unavailable while writing {self.instance_id}") from error
            if is_data_error(error):
                self.discard()
                reason = str(getattr(error, "orig", None) or error).strip().splitlines()
                raise UnstorableValueError(
                    f"{what} cannot be stored: {reason[0] if reason else type(error).__name__}"
                ) from error
            raise

    async def _write_record(self, conn: Executor, record: PendingRecord) -> None:
        flag = await history_sql.history_record_step(
            conn,
            instance_id=self.instance_id,
            token=self.token,
            step_id=record.step_id,
            kind=record.kind,
            step_name=record.step_name,
            payload=record.payload,
            payload_bytes=record.payload_bytes,
            compensations=self.unsaved_compensations,
            clear_attempts=record.clear_attempts,
        )
        self._recorded(record, flag, saved=len(self.unsaved_compensations))

    def _recorded(self, record: PendingRecord, flag: bool | None, *, saved: int) -> None:
        """After a step write: ``saved`` compensations went with it (a parallel branch may
        have registered more meanwhile; those wait for the next write)."""
        if flag is None:
            raise LeaseLostError(f"lease on {self.instance_id} was lost before step {record.step_id!r} was recorded")
        del self.unsaved_compensations[:saved]
        self.cancel_requested = self.cancel_requested or flag

    async def _flush_locked(self) -> None:
        record, self.pending = self.pending, None
        if record is None:
            return
        if record.foldable:
            sent = [c.to_json() for c in self.unsaved_compensations]
            write = InstanceWrite(self.instance_id, self.token, steps=[record.as_json()], compensations=sent)
            (flag,) = await self._storage(self.writes.store([write]), f"step {record.step_id}")
            self._recorded(record, flag, saved=len(sent))
            fault_point("step.after_commit")
            return
        await self._autocommit(lambda conn: self._write_record(conn, record), f"step {record.step_id}")
        fault_point("step.after_commit")

    async def flush(self) -> None:
        """Write the deferred step record, if any."""
        async with self.write_lock:
            await self._flush_locked()

    def discard(self) -> None:
        self.pending = None

    async def record(self, step: StepTransaction, *, defer: bool = True, **fields: Any) -> None:
        """Fenced write of one history row (plus unsaved compensations).

        Concurrent steps of one instance (``asyncio.gather``) take turns here.
        """
        record = PendingRecord(**fields)
        async with self.write_lock:
            await self._flush_locked()
            if step.in_transaction:

                async def write_in_step() -> None:
                    await self._write_record(await step.connection(), record)
                    await step.commit()
                    fault_point("step.after_commit")

                try:
                    # the activity's own ctx.session writes go in this statement's commit
                    await self._storage(write_in_step(), f"step {record.step_id} (with its ctx.session writes)")
                except BaseException:
                    await step.rollback()
                    raise
                return
            await step.close()
            if defer:
                self.pending = record
            else:
                await self._autocommit(lambda conn: self._write_record(conn, record), f"step {record.step_id}")
                fault_point("step.after_commit")

    async def write_now(self, statement: Callable[[Executor], Awaitable[T]]) -> T:
        """Run one fenced statement, after the deferred record, each its own commit."""
        async with self.write_lock:
            await self._flush_locked()
            return await self._autocommit(statement)

    async def suspend(self, statement: Callable[[Executor, FoldedWrites], Awaitable[SuspendOutcome]]) -> NoReturn:
        """Give the lease back while the instance waits (event, timer).

        ``statement`` registers what it waits for and releases the lease in one fenced
        statement, together with the step recorded just before (folded) and refusing when
        cancellation was requested: a cancel that races a suspend is applied, never
        overwritten (Edda 0.1.0 lost it).
        """
        fault_point("instance.before_release")
        async with self.write_lock:
            folded = await self._take_folded()
            outcome = await self._autocommit(lambda conn: statement(conn, folded))
            if outcome is not SuspendOutcome.LEASE_LOST:
                self.unsaved_compensations = []
        if outcome is SuspendOutcome.CANCELLED:
            self.cancel_requested = True
            self.raise_if_cancelled()
        if outcome is SuspendOutcome.LEASE_LOST:
            raise LeaseLostError(f"lease on {self.instance_id} was lost before it could suspend")
        self.log.debug("instance.suspended")
        raise Suspended()

    async def _take_folded(self) -> FoldedWrites:
        """The deferred record and unsaved compensations, for a statement that folds them
        in (call with ``write_lock`` held; rare record shapes are written first)."""
        if self.pending is not None and not self.pending.foldable:
            await self._flush_locked()
        record, self.pending = self.pending, None
        return FoldedWrites(
            pending_steps=[] if record is None else [record.as_json()],
            compensations=[c.to_json() for c in self.unsaved_compensations],
        )

    async def record_now(self, **fields: Any) -> None:
        """A fenced history write committed at once (failures, compensation records)."""
        await self.record(StepTransaction(self.db.engine), defer=False, **fields)

    # ---------------------------------------------------------------- activities

    async def run_activity(
        self, act: Activity[Any], args: tuple[Any, ...], kwargs: dict[str, Any], activity_id: str | None
    ) -> Any:
        step_id = activity_id or self.next_step_id(act.name)
        hooks = self.app.hooks
        record = self.take_recorded(step_id, act.name)
        if record is not None:
            if record.kind == ACTIVITY_FAILED:
                raise serialization.decode_error(record.payload)
            result = self._decode_result(act, record)
            self._register_on_failure(act, step_id, args, kwargs, result)
            await call_hook(hooks, "on_activity_complete", self.instance_id, step_id, act.name, result, True)
            return result

        await self.before_new_step(step_id, act.name)
        policy = act.retry_policy or self.app.default_retry_policy or DEFAULT_RETRY_POLICY
        timeout = act.timeout if act.timeout is not None else self.activity_timeout
        attempt = int(self.claimed.attempts.get(step_id, {}).get("attempts", 0))
        first_attempt = attempt
        while True:
            attempt += 1
            await call_hook(hooks, "on_activity_start", self.instance_id, step_id, act.name, False)
            step = StepTransaction(self.db.engine)
            token = current_step.set(step)
            try:
                result = await call_attempt(act, (self.ctx, *args), kwargs, timeout)
                payload, payload_bytes = self._encode_result(act, result)
                # its arguments are stored with the step record: checked here, so an
                # unstorable one is this attempt's failure
                self._register_on_failure(act, step_id, args, kwargs, result)
            except Exception as error:
                await step.rollback()
                if isinstance(error, ActivityTimeoutError):
                    self.log.warning("activity.timed_out", step=step_id, attempt=attempt, timeout=timeout)
                await call_hook(hooks, "on_activity_failed", self.instance_id, step_id, act.name, error)
                delay = await self._after_failed_attempt(act, step_id, policy, attempt, error)
                await call_hook(hooks, "on_activity_retry", self.instance_id, step_id, act.name, attempt, delay)
                self.log.info("activity.retry", step=step_id, attempt=attempt, delay=delay, error=repr(error))
                await asyncio.sleep(delay)
                continue
            except BaseException:
                await step.rollback()
                raise
            finally:
                current_step.reset(token)
            fault_point("activity.after_effect")
            try:
                await self.record(
                    step,
                    step_id=step_id,
                    kind=ACTIVITY_COMPLETED,
                    step_name=act.name,
                    payload=payload,
                    payload_bytes=payload_bytes,
                    clear_attempts=first_attempt > 0 or attempt > 1,
                )
            except UnstorableValueError as error:  # its ctx.session writes were refused
                await self._record_failure(act, step_id, error)
                raise
            self.log.debug("activity.completed", step=step_id, attempt=attempt)
            await call_hook(hooks, "on_activity_complete", self.instance_id, step_id, act.name, result, False)
            return result

    @staticmethod
    def _encode_result(act: Activity[Any], result: Any) -> tuple[Any, bytes | None]:
        if isinstance(result, bytes | bytearray | memoryview):
            return {"bytes": True}, bytes(result)
        return {"result": serialization.storable_json(result, f"activity {act.name}: result")}, None

    @staticmethod
    def _decode_result(act: Activity[Any], record: HistoryRecord) -> Any:
        if record.payload_bytes is not None:
            return record.payload_bytes
        annotation = serialization.type_hints(act.func).get("return", inspect.Parameter.empty)
        return serialization.from_json((record.payload or {}).get("result"), annotation)

    async def _after_failed_attempt(
        self, act: Activity[Any], step_id: str, policy: RetryPolicy, attempt: int, error: Exception
    ) -> float:
        """Record a failed attempt; return the delay before the next one, or raise."""
        if isinstance(error, TerminalError):
            await self._record_failure(act, step_id, error)
            raise error
        if not policy.is_retryable(error):
            final = RetryExhaustedError(
                f"Activity {act.name} failed: error type {type(error).__name__} is not retryable"
            )
            final.__cause__ = error
            await self._record_failure(act, step_id, final)
            raise final
        exhausted = policy.max_attempts is not None and attempt >= policy.max_attempts
        if not exhausted:
            outcome = await self.write_now(
                lambda conn: instances_sql.instance_record_attempt(
                    conn, self.instance_id, self.token, step_id, attempt, serialization.storable_text(repr(error))
                )
            )
            if outcome is None:
                raise LeaseLostError(f"lease on {self.instance_id} was lost while retrying {step_id!r}")
            elapsed, cancel = outcome
            self.cancel_requested = self.cancel_requested or cancel
            exhausted = policy.max_duration is not None and elapsed >= policy.max_duration
        if exhausted:
            final = RetryExhaustedError(f"Activity {act.name} failed after {attempt} attempts: {error}")
            final.__cause__ = error
            await self._record_failure(act, step_id, final)
            raise final
        if self.cancel_requested:
            self.cancelled = True
            raise WorkflowCancelledException(f"workflow instance {self.instance_id} was cancelled")
        delay = policy.delay_after(attempt)
        if delay > self.inline_retry_seconds:
            # A long back-off frees the worker: the instance becomes claimable again later.
            released = await self.write_now(
                lambda conn: instances_sql.instance_release(conn, self.instance_id, self.token, delay)
            )
            if not released:
                raise LeaseLostError(f"lease on {self.instance_id} was lost while retrying {step_id!r}")
            self.log.info("activity.retry_scheduled", step=step_id, attempt=attempt, delay=delay)
            raise Suspended()
        return delay

    async def _record_failure(self, act: Activity[Any], step_id: str, error: BaseException) -> None:
        await self.record_now(
            step_id=step_id,
            kind=ACTIVITY_FAILED,
            step_name=act.name,
            payload=serialization.encode_error(error),
            clear_attempts=True,
        )

    # ---------------------------------------------------------------- compensations

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
        position = len(self.compensations) + 1
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
        self.unsaved_compensations.append(record)

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

    # ---------------------------------------------------------------- the whole run

    async def run(self) -> str:
        """Run to the next resting point; returns the outcome for logs and tests."""
        hooks = self.app.hooks
        if self.claimed.status == "compensating" or (self.cancel_requested and not self.history):
            # Crash recovery of a saga, or a cancel that arrived before the first step:
            # nothing of the workflow body needs to run again.
            return await self._compensate(error=None, cancelled=self.cancel_requested)
        try:
            kwargs = serialization.bind_arguments(self.workflow.func, self.claimed.input)
            if self.claimed.run_count == 1:
                await call_hook(hooks, "on_workflow_start", self.instance_id, self.workflow_name, self.claimed.input)
            result = await self.workflow.func(self.ctx, **kwargs)
            if self.unconsumed:
                raise NonDeterminismError(
                    f"non-deterministic workflow {self.workflow_name!r} (instance {self.instance_id}): "
                    f"it returned while recorded step(s) {', '.join(sorted(self.unconsumed)[:5])} were never reached"
                )
        except Suspended:
            await self.flush()
            return "suspended"
        except LeaseLostError:
            self.discard()
            self.log.warning("instance.lease_lost")
            return "lease_lost"
        except StorageUnavailable:
            self.discard()
            raise
        except NonDeterminismError as error:
            self.discard()
            self.log.error("instance.non_deterministic", error=str(error))
            await self._finish_without_compensation(error)
            return "failed"
        except Exception as error:
            if self.cancelled:
                return await self._compensate(error=None, cancelled=True)
            return await self._fail(error)
        except asyncio.CancelledError:
            self.discard()
            raise
        if self.cancelled:
            return await self._compensate(error=None, cancelled=True)
        return await self._complete(result)

    async def _fail(self, error: Exception) -> str:
        """The workflow's error: its saga is undone and the instance ends failed."""
        # Log levels: a workflow that raised is the workflow's outcome, handled as
        # designed (its saga is undone), so a warning; error is kept for what needs an
        # operator: non-determinism (a code fix) and a compensation that failed for good
        # (a saga left half done).
        self.log.warning("instance.failed", error=repr(error))
        return await self._compensate(error=error, cancelled=False)

    async def _compensate(self, *, error: BaseException | None, cancelled: bool) -> str:
        from kenning.compensate import compensate_and_finish

        # compensations the database refuses to store are dealt with there
        return await compensate_and_finish(self, error=error, cancelled=cancelled)

    async def _complete(self, result: Any) -> str:
        # A result that cannot be stored is the workflow's error (its saga is undone),
        # decided before the write: written, it would be refused on every replay.
        try:
            payload = {"result": serialization.storable_json(result, f"workflow {self.workflow_name}: result")}
        except UnstorableValueError as error:
            return await self._fail(error)
        fault_point("instance.before_release")
        try:
            async with self.write_lock:
                folded = await self._take_folded()
                write = InstanceWrite(
                    self.instance_id,
                    self.token,
                    steps=folded.pending_steps,
                    compensations=folded.compensations,
                    complete=True,
                    result=payload,
                )
                stored = await self._storage(self.writes.store([write]), f"workflow {self.workflow_name}: completion")
        except UnstorableValueError as error:
            return await self._fail(error)
        done = stored[0] is not None
        if not done:
            raise LeaseLostError(f"lease on {self.instance_id} was lost before completion")
        self.log.debug("instance.completed")
        await call_hook(self.app.hooks, "on_workflow_complete", self.instance_id, self.workflow_name, result)
        return "completed"

    async def _finish_without_compensation(self, error: Exception) -> str:
        if not isinstance(error, NonDeterminismError):  # logged at error level already
            self.log.warning("instance.failed", error=repr(error))
        encoded = serialization.encode_error(error)

        def finish(conn: Executor) -> Awaitable[bool]:
            return instances_sql.instance_finish(conn, self.instance_id, self.token, "failed", encoded)

        try:
            await self.write_now(finish)
        except UnstorableValueError:  # the deferred record was refused and dropped; the error is storable
            await self.write_now(finish)
        await call_hook(self.app.hooks, "on_workflow_failed", self.instance_id, self.workflow_name, error)
        return "failed"
