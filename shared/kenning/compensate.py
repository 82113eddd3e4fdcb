"""Running a saga's compensations: newest first, each recorded exactly once.

Used when a workflow fails, when it is cancelled, and when a worker picks up an instance
another worker left in ``compensating``: the compensation list and the records of those
already run are both in the database, so no workflow code needs to run again.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any

from kenning import serialization
from kenning.compensation import ON_FAILURE_PREFIX, CompensationFailedError, bind_on_failure
from kenning.context import StepTransaction, current_step
from kenning.errors import KenningError, LeaseLostError, UnstorableValueError
from kenning.faults import fault_point
from kenning.hooks import call_hook
from kenning.registry import qualified_name
from kenning.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from kenning.storage import instances as instances_sql
from kenning.storage import sagas as sagas_sql
from kenning.storage.records import CompensationRecord

if TYPE_CHECKING:
    from kenning.replay import Replayer


async def compensate_and_finish(replayer: Replayer, *, error: BaseException | None, cancelled: bool) -> str:
    """Run outstanding compensations, then end the instance ``cancelled`` or ``failed``.

    ``error`` is None when resuming a saga whose error is already stored. A compensation
    that fails for good does not stop the others (as in Edda), but the saga is not undone:
    the instance ends ``failed`` with a ``CompensationFailedError`` naming each one, and
    ``kenning instances retry`` runs them again after a deploy.
    """
    from kenning.replay import COMPENSATION_EXECUTED, COMPENSATION_FAILED

    encoded = serialization.encode_error(error) if error is not None else None
    try:
        dropped = await _begin(replayer, encoded)
        done = {s for s, r in replayer.history.items() if r.kind in (COMPENSATION_EXECUTED, COMPENSATION_FAILED)}
        failures: list[tuple[CompensationRecord, BaseException]] = []
        for comp in sorted(replayer.compensations, key=lambda c: c.position, reverse=True):
            step_id = f"compensation:{comp.comp_id}"
            if step_id in done:
                continue
            succeeded, failure = await _run_one(replayer, comp)
            if succeeded is not None:
                # Recorded in the compensation's own transaction: its ctx.session writes
                # and the record commit together, so a crash can never run it twice.
                try:
                    await replayer.record(
                        succeeded,
                        step_id=step_id,
                        kind=COMPENSATION_EXECUTED,
                        step_name=comp.function_name,
                        payload={"args": comp.args, "kwargs": comp.kwargs},
                        defer=False,
                    )
                except UnstorableValueError as refused:  # its ctx.session writes: refused on every try
                    succeeded, failure = None, refused
            if succeeded is not None:
                replayer.log.info("compensation.executed", compensation=comp.function_name, comp_id=comp.comp_id)
            else:
                assert failure is not None
                await replayer.record_now(
                    step_id=step_id,
                    kind=COMPENSATION_FAILED,
                    step_name=comp.function_name,
                    payload=serialization.encode_error(failure),
                )
                replayer.log.error(
                    "compensation.failed", compensation=comp.function_name, comp_id=comp.comp_id, error=repr(failure)
                )
                failures.append((comp, failure))
        fault_point("instance.before_release")
        status = "cancelled" if cancelled and not failures and not dropped else "failed"
        if failures or dropped:
            incomplete = _incomplete_saga(replayer.instance_id, failures, dropped, error, cancelled)
            finished = await replayer.write_now(
                lambda conn: sagas_sql.saga_fail(
                    conn, replayer.instance_id, replayer.token, serialization.encode_error(incomplete)
                )
            )
            error = incomplete
        else:
            finished = await replayer.write_now(
                lambda conn: instances_sql.instance_finish(conn, replayer.instance_id, replayer.token, status, encoded)
            )
        if not finished:
            raise LeaseLostError(f"lease on {replayer.instance_id} was lost before it finished")
    except LeaseLostError:
        replayer.discard()
        replayer.log.warning("instance.lease_lost")
        return "lease_lost"
    hooks = replayer.app.hooks
    if status == "cancelled":
        replayer.log.info("instance.cancelled")
        await call_hook(hooks, "on_workflow_cancelled", replayer.instance_id, replayer.workflow_name)
    else:
        replayer.log.info("instance.compensated", status=status)
        reported = error if error is not None else KenningError("failed before a restart; see the stored error")
        await call_hook(hooks, "on_workflow_failed", replayer.instance_id, replayer.workflow_name, reported)
    return status


async def _begin(replayer: Replayer, encoded: dict[str, Any] | None) -> list[tuple[CompensationRecord, str]]:
    """Make the instance ``compensating``, saving with it the compensations registered since
    the last write. Returns those the database refused to store, with why: they are dropped
    and never run, so the saga cannot end as undone.

    Only this write's refusal is handled here. One that comes later (a compensation's
    record, the end of the saga) ends the run: the next run resumes the saga from what is
    stored, so a compensation already recorded never runs twice.
    """
    try:
        # The deferred step record on its own first: when it is the value refused, it is
        # dropped (the run is undoing its step anyway) and the compensations riding with it
        # still get their own write below.
        await replayer.flush()
    except UnstorableValueError as refused:
        replayer.log.warning("instance.step_unstorable", error=str(refused))
    unsaved = list(replayer.unsaved_compensations)
    try:
        await _write_begin(replayer, encoded, unsaved)
        return []
    except UnstorableValueError as refused:
        if not unsaved:
            raise  # the error is always storable (encode_error): nothing else to leave out
        reason = str(refused)
    # Run the saga without them rather than replay into the same refusal for ever.
    ids = {c.comp_id for c in unsaved}
    replayer.compensations = [c for c in replayer.compensations if c.comp_id not in ids]
    replayer.log.error("instance.compensations_unstorable", comp_ids=sorted(ids), error=reason)
    await _write_begin(replayer, encoded, [])
    return [(c, reason) for c in unsaved]


async def _write_begin(replayer: Replayer, encoded: dict[str, Any] | None, comps: list[CompensationRecord]) -> None:
    sent = [c.to_json() for c in comps]
    ok = await replayer.write_now(
        lambda conn: instances_sql.instance_begin_compensating(
            conn, replayer.instance_id, replayer.token, encoded, sent
        )
    )
    if not ok:
        raise LeaseLostError(f"lease on {replayer.instance_id} was lost before compensating")
    replayer.unsaved_compensations = []


def _incomplete_saga(
    instance_id: str,
    failures: list[tuple[CompensationRecord, BaseException]],
    dropped: list[tuple[CompensationRecord, str]],
    error: BaseException | None,
    cancelled: bool,
) -> CompensationFailedError:
    """The instance's error when compensations failed or were never stored: which, why, and
    what was undone."""
    each = [f"compensation {c.function_name} ({c.comp_id}) failed: {type(e).__name__}: {e}" for c, e in failures]
    each += [
        f"compensation {c.function_name} ({c.comp_id}) was never run: the database refused to store it ({why})"
        for c, why in dropped
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
    stored_kwargs = comp.kwargs
    if comp.comp_id.startswith(ON_FAILURE_PREFIX) and not comp.args:
        stored_kwargs = bind_on_failure(func, comp.kwargs)
    args = [
        serialization.from_json(value, hints.get(params[i].name, Any)) if i < len(params) else value
        for i, value in enumerate(comp.args)
    ]
    kwargs = {k: serialization.from_json(v, hints.get(k, Any)) for k, v in stored_kwargs.items()}
    try:
        serialization.signature(func).bind(None, *args, **kwargs)  # None: the ctx slot
    except TypeError as error:
        raise TypeError(
            f"compensation {qualified_name(func)} cannot be called with its recorded arguments: {error}"
        ) from None
    return args, kwargs


async def _run_one(replayer: Replayer, comp: CompensationRecord) -> tuple[StepTransaction | None, BaseException | None]:
    """Run one compensation with its retry policy: its open transaction on success, or the
    final error."""
    target = replayer.app.registry.compensation(comp.function_name)
    if target is None:
        return None, LookupError(
            f"compensation {comp.function_name} is not registered in this worker; import its module with --app"
        )
    func = getattr(target, "func", target)  # an @activity used as a compensation runs its function
    policy = (
        RetryPolicy.from_json(comp.retry_policy)
        if comp.retry_policy
        else (replayer.app.default_retry_policy or DEFAULT_RETRY_POLICY)
    )
    try:
        args, kwargs = _arguments(func, comp)
    except TypeError as error:  # no attempt can succeed on this code: not retried
        return None, error
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempt = 0
    while True:
        attempt += 1
        step = StepTransaction(replayer.db.engine)
        token = current_step.set(step)
        try:
            if inspect.iscoroutinefunction(func):
                await func(replayer.ctx, *args, **kwargs)
            else:
                await asyncio.to_thread(func, replayer.ctx, *args, **kwargs)
            return step, None
        except Exception as error:
            await step.rollback()
            out_of_time = policy.max_duration is not None and loop.time() - started >= policy.max_duration
            out_of_attempts = policy.max_attempts is not None and attempt >= policy.max_attempts
            if not policy.is_retryable(error) or out_of_time or out_of_attempts:
                return None, error
            await call_hook(
                replayer.app.hooks,
                "on_activity_retry",
                replayer.instance_id,
                f"compensation:{comp.comp_id}",
                comp.function_name,
                attempt,
                policy.delay_after(attempt),
            )
            await asyncio.sleep(policy.delay_after(attempt))
        except BaseException:
            await step.rollback()
            raise
        finally:
            current_step.reset(token)
