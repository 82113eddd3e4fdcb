"""Undoing a saga: the engine's compensation runner (the user's side, ``@compensation``
and ``register_compensation``, is ``kenning.compensation``).

Compensations run newest first, each recorded exactly once, each retried durably by the
same loop as activities (``WorkflowRun.attempts``: attempts counted on the instance, a
long back-off releases it). Used when a workflow fails, when it is cancelled, and when a
worker picks up an instance left ``compensating`` (a crash, a back-off, ``kenning
instances retry``): the compensation list and the records of those already run are both
stored, so no workflow code needs to run again.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kenning import codecs, serialization
from kenning.compensation import ON_FAILURE_PREFIX, CompensationFailedError, bind_on_failure
from kenning.context import StepScope
from kenning.core.names import COMPENSATION_EXECUTED, COMPENSATION_FAILED
from kenning.core.records import CompensationRecord
from kenning.engine.commands import BeginCompensating, DroppedCompensation, FailSaga, FinalStatus, Finish, RecordStep
from kenning.engine.history import StepRecord, StepTiming, compensation_step_id
from kenning.engine.outcomes import GaveUp, RunOutcome
from kenning.errors import KenningError, UnstorableValueError
from kenning.registry import qualified_name
from kenning.retry import DEFAULT_RETRY_POLICY, RetryPolicy

if TYPE_CHECKING:
    from kenning.engine.run import WorkflowRun


async def undo_saga(run: WorkflowRun, *, error: BaseException | None, cancelled: bool) -> RunOutcome:
    """Run outstanding compensations, then end the instance ``cancelled`` or ``failed``.

    ``error`` is None when resuming a saga whose error is already stored. A compensation
    that fails for good does not stop the others (as in Edda), but the saga is not undone:
    the instance ends ``failed`` with a ``CompensationFailedError`` naming each one, and
    ``kenning instances retry`` runs them again after a deploy.
    """
    encoded = serialization.encode_error(error) if error is not None else None
    dropped = await _begin(run, encoded)
    done = run.cursor.compensations_done()
    failures: list[tuple[CompensationRecord, BaseException]] = []
    # newest first: the reverse of the order the workflow registered them in
    for comp in sorted(run.compensations, key=lambda c: c.position, reverse=True):
        step_id = compensation_step_id(comp.comp_id)
        if step_id in done:
            continue
        failure = await _run_one(run, comp, step_id)
        if failure is None:
            run.log.info("compensation.executed", compensation=comp.function_name, comp_id=comp.comp_id)
            continue
        error_record = failure.error
        record = StepRecord(
            step_id,
            COMPENSATION_FAILED,
            comp.function_name,
            serialization.encode_error(error_record),
            clear_attempts=failure.counted,
            timing=failure.timing,
        )
        await run.port.record_step(RecordStep(record, defer=False, what=f"compensation {comp.comp_id}"))
        run.log.error(
            "compensation.failed", compensation=comp.function_name, comp_id=comp.comp_id, error=repr(error_record)
        )
        failures.append((comp, error_record))
    status = FinalStatus.CANCELLED if cancelled and not failures and not dropped else FinalStatus.FAILED
    if failures or dropped:
        incomplete = _incomplete_saga(run.instance_id, failures, dropped, error, cancelled)
        await run.port.finish(FailSaga(serialization.encode_error(incomplete)))
        error = incomplete
    else:
        await run.port.finish(Finish(status, encoded))
    if status is FinalStatus.CANCELLED:
        run.log.info("instance.cancelled")
        await run.hook("on_workflow_cancelled", run.workflow_name)
        return RunOutcome.CANCELLED
    run.log.info("instance.compensated", status=status.value)
    reported = error if error is not None else KenningError("failed in an earlier run; see the stored error")
    await run.hook("on_workflow_failed", run.workflow_name, reported)
    return RunOutcome.FAILED


async def _begin(run: WorkflowRun, encoded: dict[str, Any] | None) -> list[DroppedCompensation]:
    """Make the instance ``compensating``, saving with it the compensations registered
    since the last write. Returns those the database refused to store: they are dropped
    and never run, so the saga cannot end as undone.

    Only this write's refusal is handled here. One that comes later (a compensation's
    record, the end of the saga) ends the run: the next run resumes the saga from what is
    stored, so a compensation already recorded never runs twice.
    """
    try:
        # The deferred step record on its own first: when it is the value refused, it is
        # dropped (the run is undoing its step anyway) and the compensations riding with it
        # still get their own write.
        await run.port.flush()
    except UnstorableValueError as refused:
        run.log.warning("instance.step_unstorable", error=str(refused))
    dropped = await run.port.begin_compensating(BeginCompensating(encoded))
    if dropped:
        # Run the saga without them rather than replay into the same refusal for ever.
        ids = {d.record.comp_id for d in dropped}
        run.compensations = [c for c in run.compensations if c.comp_id not in ids]
        run.log.error("instance.compensations_unstorable", comp_ids=sorted(ids), error=dropped[0].reason)
    return dropped


@dataclass(frozen=True)
class _Failure:
    """How one compensation ended when it did not succeed."""

    error: BaseException
    counted: bool  # attempts were counted for it: its record clears them
    timing: StepTiming | None  # None: it never ran (not registered, arguments refused)


async def _run_one(run: WorkflowRun, comp: CompensationRecord, step_id: str) -> _Failure | None:
    """Run one compensation with its retry policy and record it; None when it succeeded."""
    target = run.app.registry.compensation(comp.function_name)
    if target is None:
        missing = LookupError(
            f"compensation {comp.function_name} is not registered in this worker; import its module with --app"
        )
        return _Failure(missing, False, None)
    func = getattr(target, "func", target)  # an @activity used as a compensation runs its function
    policy = (
        RetryPolicy.from_json(comp.retry_policy)
        if comp.retry_policy
        else (run.app.default_retry_policy or DEFAULT_RETRY_POLICY)
    )
    try:
        args, kwargs = _arguments(func, comp)
    except TypeError as error:  # no attempt can succeed on this code: not retried
        return _Failure(error, False, None)

    async def attempt(_: StepScope) -> None:
        if inspect.iscoroutinefunction(func):
            await func(run.ctx, *args, **kwargs)
        else:
            await asyncio.to_thread(func, run.ctx, *args, **kwargs)

    outcome = await run.attempts(step_id, comp.function_name, policy, attempt, activity=False)
    if isinstance(outcome, GaveUp):
        return _Failure(outcome.error, outcome.counted, outcome.timing)
    # Recorded in the compensation's own transaction: its ctx.session writes and the
    # record commit together, so a crash can never run it twice.
    record = StepRecord(
        step_id,
        COMPENSATION_EXECUTED,
        comp.function_name,
        {"args": comp.args, "kwargs": comp.kwargs},
        clear_attempts=outcome.counted,
        timing=outcome.timing,
    )
    try:
        await run.port.record_step(RecordStep(record, defer=False, what=f"compensation {comp.comp_id}"), outcome.step)
    except UnstorableValueError as refused:  # its ctx.session writes: refused on every try
        return _Failure(refused, outcome.counted, outcome.timing)
    return None


def _incomplete_saga(
    instance_id: str,
    failures: list[tuple[CompensationRecord, BaseException]],
    dropped: list[DroppedCompensation],
    error: BaseException | None,
    cancelled: bool,
) -> CompensationFailedError:
    """The instance's error when compensations failed or were never stored: which, why, and
    what was undone."""
    each = [f"compensation {c.function_name} ({c.comp_id}) failed: {type(e).__name__}: {e}" for c, e in failures]
    each += [
        f"compensation {d.record.function_name} ({d.record.comp_id}) was never run: the database refused to "
        f"store it ({d.reason})"
        for d in dropped
    ]
    if cancelled:
        undoing = " (the instance was cancelled)"
    elif error is not None:
        undoing = f" (it was undoing {type(error).__name__}: {error})"
    else:
        undoing = ""
    advice = []
    if failures:
        advice.append(f"fix the compensation, then run `kenning instances retry {instance_id}`")
    if dropped:  # nothing stored to retry: its arguments are known only from this message
        advice.append("undo by hand what the compensation never run would have undone")
    return CompensationFailedError(f"{'; '.join(each)}; the saga is not undone{undoing}; {'; '.join(advice)}")


def _arguments(func: Any, comp: CompensationRecord) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild stored JSON arguments with the compensation's own type hints.

    An ``@on_failure`` compensation is bound by name from the activity's arguments and
    result (records of older versions stored positional arguments: those are passed as
    they were). ``TypeError`` says why a compensation can never be called so.
    """
    hints = serialization.type_hints(func)
    params = list(serialization.signature(func).parameters.values())[1:]
    stored_args: list[Any] = codecs.unseal(comp.args)
    stored_kwargs: dict[str, Any] = codecs.unseal(comp.kwargs)
    if comp.comp_id.startswith(ON_FAILURE_PREFIX) and not stored_args:
        stored_kwargs = bind_on_failure(func, stored_kwargs)
    args = [
        serialization.from_json(value, hints.get(params[i].name, Any)) if i < len(params) else value
        for i, value in enumerate(stored_args)
    ]
    kwargs = {k: serialization.from_json(v, hints.get(k, Any)) for k, v in stored_kwargs.items()}
    try:
        serialization.signature(func).bind(None, *args, **kwargs)  # None: the ctx slot
    except TypeError as error:
        raise TypeError(
            f"compensation {qualified_name(func)} cannot be called with its recorded arguments: {error}"
        ) from None
    return args, kwargs
