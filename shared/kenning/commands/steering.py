"""The operator's actions on instances, one place for the CLI and the console: cancel,
retry, terminate, skip a compensation, fork, each on one instance or by filter in batches, and
each recorded in the operator action log (``kenning_operator_actions``) in the
transaction that does it, with where it came from.

``refusal`` says, before anything is asked, why an action would be refused, from the
instance's row; ``refusal_now`` adds what its saga's history decides (a retry after its
compensations ran, a skip with nothing to skip). Each action refuses through them, and the
console offers only the actions ``offers`` finds accepted: one judgement, not a copy.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from kenning.client.forks import Fork, fork_action, fork_instance
from kenning.core.records import InstanceRow
from kenning.db import Database, Executor
from kenning.errors import UsageError
from kenning.storage import actions as actions_sql
from kenning.storage import bulk as bulk_sql
from kenning.storage import claims as claims_sql
from kenning.storage import escapes as escapes_sql
from kenning.storage import instances as instances_sql
from kenning.storage import sagas as sagas_sql
from kenning.storage.actions import OperatorAction
from kenning.storage.bulk import BulkFilter
from kenning.storage.sagas import SagaState

_log = structlog.get_logger("kenning.operator")

LIVE_STATUSES = (
    "pending",
    "running",
    "waiting_for_event",
    "waiting_for_timer",
    "waiting_for_message",
    "compensating",
)
# the statuses each bulk action applies to: a filter never selects what it would refuse
BULK_STATUSES: dict[str, tuple[str, ...]] = {
    "cancel": LIVE_STATUSES,
    "retry": ("failed",),
    "terminate": LIVE_STATUSES,
}
BATCH_SIZE = 100  # instances per transaction of a bulk action: its locks last one batch
STALLED_SAGA = "its compensations are running: if one fails for ever, end it with terminate, or skip that compensation"


@dataclass(frozen=True)
class Who:
    """Where an action came from, as the action log records it."""

    origin: str  # cli, console, api, mcp
    actor: str


def cli_who() -> Who:
    """The CLI's operator: the user and machine it runs as."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        user = "unknown"
    return Who("cli", f"{user}@{socket.gethostname()}")


@dataclass(frozen=True)
class Outcome:
    done: bool
    message: str
    status: str | None = None  # the status it met (a cancel's, under its row lock)


class Steered(Protocol):
    """What the refusals read of an instance: an ``InstanceRow``, or the console page's
    bounded row (its error holding no more than its ``reason``)."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def cancel_requested(self) -> bool: ...
    @property
    def error(self) -> dict[str, Any] | None: ...


def _crash_looped(row: Steered) -> bool:
    return row.status == "failed" and (row.error or {}).get("reason") == claims_sql.CRASH_LOOP


ACTIONS = ("cancel", "retry", "terminate", "skip-compensation")
UNDONE = "{executed} compensation(s) already undid its steps; start a new instance instead"


def refusal(action: str, row: Steered) -> str | None:
    """Why ``action`` would be refused on this instance, judged on its row alone, or None
    when the row allows it (``refusal_now`` adds what its saga's history decides)."""
    ended = row.status in ("completed", "failed", "cancelled")
    if action == "cancel":
        if ended and not _crash_looped(row):
            return f"too late to cancel: it already ended {row.status}"
        if row.status == "compensating" and row.cancel_requested:
            return f"it is already being cancelled; {STALLED_SAGA}"
        if row.cancel_requested and not ended:  # asked once: it stops at its next step boundary
            return "it is already being cancelled: it stops at its next step boundary"
        return None
    if action == "retry":
        if row.status != "failed":
            return f"it is {row.status}: only a failed instance can be retried"
        if escapes_sql.error_of_terminated(row.error):
            return "it was terminated by an operator: start a new instance instead"
        return None
    if action == "terminate":
        return f"it already ended {row.status}" if ended else None
    if action == "skip-compensation":
        if row.status not in ("compensating", "failed"):
            return f"it is {row.status}: only a saga that is compensating or failed at a compensation has one to skip"
        return None
    raise ValueError(f"unknown action {action!r}")


def _announce(who: Who) -> Callable[..., Any]:
    """How an action is logged: at info in a service's log (the console's, the MCP server's);
    at debug from the CLI, whose own output already says what it did (and the action log
    keeps it), so that a log line does not follow every operator command's output."""
    log: Callable[..., Any] = _log.debug if who.origin == "cli" else _log.info
    return log


def saga_refusal(action: str, row: Steered, saga: SagaState) -> str | None:
    """Why ``action`` would be refused for what the instance's saga did, or None: a retry
    once compensations undid its steps (replaying them would be wrong) unless one failed
    (then those run again) or it was parked as a crash loop; a skip with no compensation
    left to run, or on a failed instance no compensation of which failed."""
    if action == "retry" and saga.executed and not saga.failed and not _crash_looped(row):
        return UNDONE.format(executed=saga.executed)
    if action == "skip-compensation":
        if row.status == "failed" and not saga.failed:
            return "it failed in a step, not at a compensation: there is no compensation to skip"
        if not saga.open:
            return "it has no compensation still to run"
    return None


async def refusal_now(conn: Executor, action: str, row: Steered) -> str | None:
    """Why ``action`` would be refused on this instance now: its row, then its saga."""
    refused = refusal(action, row)
    if refused is not None or action not in ("retry", "skip-compensation"):
        return refused
    return saga_refusal(action, row, await sagas_sql.saga_state(conn, row.id))


async def offers(conn: Executor, row: Steered) -> dict[str, str | None]:
    """Each action's refusal on this instance now (None: it would be accepted), its saga
    read once: what the console offers, and why not the others."""
    refused = {action: refusal(action, row) for action in ACTIONS}
    if refused["retry"] is None or refused["skip-compensation"] is None:
        saga = await sagas_sql.saga_state(conn, row.id)
        for action in ("retry", "skip-compensation"):
            if refused[action] is None:
                refused[action] = saga_refusal(action, row, saga)
    return refused


async def _record(conn: Executor, who: Who, action: str, row: InstanceRow, outcome: Outcome, **extra: Any) -> None:
    reason = extra.pop("reason", None)
    await actions_sql.action_record(
        conn,
        OperatorAction(
            action=action,
            origin=who.origin,
            actor=who.actor,
            target=row.id,
            affected=1 if outcome.done else 0,
            reason=reason,
            details={"workflow": row.workflow_name, "status": row.status, "message": outcome.message, **extra},
        ),
    )
    _announce(who)(
        "operator.action", action=action, origin=who.origin, actor=who.actor, instance_id=row.id, done=outcome.done
    )


async def cancel(conn: Executor, row: InstanceRow, who: Who) -> Outcome:
    """Ask one instance to cancel (its compensations then run on a worker). Call it in a
    transaction: the request and its record commit together."""
    refused = refusal("cancel", row)
    if refused is not None:
        outcome = Outcome(False, refused, row.status)
    else:
        met = await instances_sql.instance_request_cancel(conn, row.id)
        # the status the cancel met under its row lock, not the one read before it
        before, accepted = met if met is not None else (row.status, False)
        message = "cancellation requested" if accepted else f"too late to cancel: it already ended {before}"
        outcome = Outcome(accepted, message, before)
    await _record(conn, who, "cancel", row, outcome)
    return outcome


async def retry(conn: Executor, row: InstanceRow, who: Who) -> Outcome:
    """Retry a failed instance (``retry_instance``), recorded."""
    refused = await refusal_now(conn, "retry", row)
    outcome = Outcome(False, refused) if refused is not None else await _retry(conn, row)
    await _record(conn, who, "retry", row, outcome)
    return outcome


async def _retry(conn: Executor, row: InstanceRow) -> Outcome:
    """A rollback stopped at a failed compensation runs its compensations not yet
    executed; any other failure re-runs from its history; a crash-looped instance
    resumes as it was parked."""
    rerun = None if _crash_looped(row) else await sagas_sql.saga_retry(conn, row.id)
    if rerun is not None:
        return Outcome(True, f"compensating again; {rerun} failed compensation(s) will run again")
    retried = await instances_sql.instance_retry(conn, row.id)
    return Outcome(bool(retried["retried"]), str(retried["message"]))


async def terminate(conn: Executor, row: InstanceRow, who: Who, reason: str) -> Outcome:
    """End one instance now, without compensating, recorded with its reason."""
    refused = refusal("terminate", row)
    if refused is not None:
        outcome = Outcome(False, refused)
    else:
        ended = await escapes_sql.instances_terminate(conn, [row.id], reason)
        outcome = Outcome(True, "terminated") if ended else Outcome(False, "it ended before the terminate")
    await _record(conn, who, "terminate", row, outcome, reason=reason)
    return outcome


async def skip_compensation(
    conn: Executor, row: InstanceRow, who: Who, reason: str, comp_id: str | None = None
) -> Outcome:
    """Record one compensation as skipped so the saga goes on: ``comp_id``, or the one
    failing now (attempts counted, or failed for good) when it is the only one."""
    refused = await refusal_now(conn, "skip-compensation", row)
    chosen = comp_id
    if refused is None and chosen is None:
        failing = [c for c in await escapes_sql.compensations_open(conn, row.id) if c.failed or c.attempts]
        if not failing:
            refused = "no compensation of it is failing: name one with --compensation"
        elif len(failing) > 1:
            names = ", ".join(f"{c.comp_id} ({c.function_name})" for c in failing)
            refused = f"{len(failing)} compensations are failing, name one with --compensation: {names}"
        else:
            chosen = failing[0].comp_id
    if refused is not None or chosen is None:
        outcome = Outcome(False, refused or "no compensation named")
    else:
        skipped = await escapes_sql.compensation_skip(conn, row.id, chosen, reason)
        if not skipped.skipped:
            outcome = Outcome(False, f"it has no compensation {chosen!r} still to run")
        elif skipped.others_failed:
            outcome = Outcome(
                True,
                f"compensation {chosen} skipped; {skipped.others_failed} other failed compensation(s) still stop "
                "the saga: skip or retry them",
            )
        else:
            outcome = Outcome(True, f"compensation {chosen} skipped; the saga goes on past it")
    await _record(conn, who, "skip-compensation", row, outcome, reason=reason, compensation=chosen)
    return outcome


async def fork(
    conn: Executor,
    row: InstanceRow,
    who: Who,
    step: str | int,
    arguments: dict[str, Any] | None = None,
    reason: str | None = None,
) -> Fork:
    """Fork one instance at ``step`` (``kenning.client.forks``), recorded. A step it
    does not have raises ``ForkStepError``, an input its workflow refuses
    ``InvalidInputError``: nothing was done, so nothing is recorded."""
    forked = await fork_instance(conn, row, step, arguments)
    await actions_sql.action_record(conn, fork_action(row, forked, who.origin, who.actor, reason))
    _log.info(
        "operator.action",
        action="fork",
        origin=who.origin,
        actor=who.actor,
        instance_id=row.id,
        fork_id=forked.fork_id,
        step=forked.step,
        done=True,
    )
    return forked


def bulk_filter(
    action: str,
    statuses: list[str] | None,
    *,
    workflow: str | None = None,
    created_before: datetime | None = None,
    created_after: datetime | None = None,
) -> BulkFilter:
    """The filter of a bulk ``action``; UsageError names a status it would refuse."""
    eligible = BULK_STATUSES[action]
    wrong = [s for s in statuses or [] if s not in eligible]
    if wrong:
        raise UsageError(f"{action} never applies to {', '.join(wrong)} instances: choose among {', '.join(eligible)}")
    if created_before is not None and created_after is not None and created_after >= created_before:
        raise UsageError("--created-after must be before --created-before")
    return BulkFilter(
        statuses=tuple(statuses or eligible),
        workflow=workflow or None,
        created_before=created_before,
        created_after=created_after,
        not_cancel_requested=action == "cancel",
        not_terminated=action == "retry",
    )


@dataclass(frozen=True)
class BulkResult:
    matched: int  # selected by the filter when the action began
    affected: int  # changed by it
    batches: int
    action_id: int | None  # its record in the action log; None for a dry run


async def bulk(
    database: Database,
    action: str,
    selected: BulkFilter,
    who: Who,
    *,
    reason: str | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> BulkResult:
    """Apply ``action`` to every instance ``selected`` picks, ``batch_size`` per
    transaction, the count first; a dry run only counts. One record in the action log,
    its ``affected`` brought up to date in each batch's transaction."""
    async with database.connection() as conn:
        as_of = await bulk_sql.bulk_now(conn)
        matched = await bulk_sql.bulk_count(conn, selected, as_of)
    if dry_run:
        return BulkResult(matched, 0, 0, None)
    async with database.transaction() as conn:
        record = OperatorAction(
            action=action,
            origin=who.origin,
            actor=who.actor,
            filter=selected.shown(),
            reason=reason,
            details={"matched": matched, "bulk": True},
        )
        action_id = await actions_sql.action_record(conn, record)
    affected = batches = 0
    after: str | None = None
    while True:
        async with database.transaction() as conn:
            ids = await bulk_sql.bulk_page(conn, selected, as_of, after_id=after, limit=batch_size)
            if not ids:
                break
            done = await _apply(conn, action, ids, reason or "")
            batches += 1
            affected = await actions_sql.action_progress(conn, action_id, done, {"batches": batches})
        after = ids[-1]
    _announce(who)(
        "operator.bulk_action",
        action=action,
        origin=who.origin,
        actor=who.actor,
        matched=matched,
        affected=affected,
        batches=batches,
    )
    return BulkResult(matched, affected, batches, action_id)


async def _apply(conn: Executor, action: str, ids: list[str], reason: str) -> int:
    """One batch: how many of ``ids`` the action changed."""
    if action == "terminate":
        return len(await escapes_sql.instances_terminate(conn, ids, reason))
    done = 0
    for instance_id in ids:
        if action == "cancel":
            met = await instances_sql.instance_request_cancel(conn, instance_id)
            done += bool(met and met[1])
        else:
            row = await instances_sql.instance_get(conn, instance_id)
            done += row is not None and await refusal_now(conn, "retry", row) is None and (await _retry(conn, row)).done
    return done
