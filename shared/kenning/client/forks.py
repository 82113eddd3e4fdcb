"""Forking an instance (``Client.fork``, ``kenning instances fork``, the console's fork
form): which step a fork starts from, its input checked as a start's, and the one
statement that makes it (``kenning.storage.forks``).

A step is named as ``kenning instances show`` shows the history: its number (the
records in order, from 1) or its step id (``charge:1``). The records before it are kept
and replayed, so those steps do not run again; the step itself and all after it run
anew, with the code the workers have today. It must be a record of the workflow body: a
compensation's record belongs to the original's rollback, which a fork does not keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kenning.core.names import COMPENSATION_EXECUTED, COMPENSATION_FAILED, COMPENSATION_SKIPPED, ON_FAILURE_PREFIX
from kenning.core.records import InstanceRow
from kenning.db import Executor
from kenning.errors import KenningError, WorkflowNotFoundError
from kenning.registry import REGISTRY, Registry
from kenning.starting import prepare_start, time_ordered_hex
from kenning.storage import forks as forks_sql
from kenning.storage.actions import OperatorAction
from kenning.storage.forks import ForkPoint

# a compensation's history record (kenning.engine.history's kinds and step ids, which this
# floor does not import): the original's rollback, never kept
_COMPENSATION_KINDS = frozenset({COMPENSATION_EXECUTED, COMPENSATION_FAILED, COMPENSATION_SKIPPED})
_COMPENSATION_STEP_PREFIX = "compensation:"
# a child's result step is its start's id and this (kenning.engine.children.result_step_id)
_CHILD_RESULT_SUFFIX = ":result"


class ForkStepError(KenningError, ValueError):
    """The step to fork from names no step of the instance's history, or one a fork
    cannot start from: a compensation's record, or a step after a ``start_child`` whose
    child is still running (it tells only the original of its end)."""


@dataclass(frozen=True)
class Fork:
    """A fork made: its id, the original's step it starts from (number and id), how many
    records it kept, and how many of the kept steps the original's compensations undid."""

    fork_id: str
    original_id: str
    step: int
    step_id: str
    kept: int
    undone: int

    def said(self) -> str:
        """What the operator reads."""
        text = (
            f"forked as {self.fork_id} from step {self.step} ({self.step_id}): "
            f"{self.kept} earlier record(s) kept, not run again"
        )
        if self.undone:  # the kept record says done; the original's rollback undid it
            text += f"; note: the original's compensations undid {self.undone} of the kept step(s)"
        return text


def resolve_step(history: Sequence[ForkPoint], step: str | int) -> int:
    """The number (from 1) of ``step``, a number or a step id, in ``history`` (oldest
    first, as ``forks_sql.fork_points`` reads it). ``ForkStepError`` names the problem."""
    count = len(history)
    if isinstance(step, int) or str(step).strip().isdigit():
        number = int(step)
        if not 1 <= number <= count:
            shown = f"1 to {count}" if count else "none: nothing is recorded yet"
            raise ForkStepError(f"step {number} is out of range: its history's steps are {shown}")
    else:
        ids = [h.step_id for h in history]
        if step not in ids:
            raise ForkStepError(f"no step {step!r} in its history (kenning instances show lists them)")
        number = ids.index(str(step)) + 1
    record = history[number - 1]
    if record.kind in _COMPENSATION_KINDS:
        raise ForkStepError(
            f"step {number} is a compensation's record ({record.step_id}): fork from a step of the workflow body"
        )
    _refuse_running_children(history[: number - 1])
    return number


def _refuse_running_children(kept: Sequence[ForkPoint]) -> None:
    """A kept ``start_child`` whose child is still running (and whose result is not kept
    too) would leave the fork waiting for ever: the child is the original's, and tells
    only it of its end. The earliest such step is where a fork can start instead: the
    fork then starts a child of its own."""
    kept_ids = {h.step_id for h in kept}
    for record in kept:
        if record.running_child is not None and record.step_id + _CHILD_RESULT_SUFFIX not in kept_ids:
            raise ForkStepError(
                f"step {record.number} ({record.step_id}) started child {record.running_child}, which is still "
                f"running and tells only the original of its end: fork from step {record.number} or earlier "
                "(the fork starts a child of its own), or once that child has ended"
            )


def _undone(history: Sequence[ForkPoint], number: int) -> int:
    """How many of the steps kept at ``number`` a compensation of the original undid."""
    kept = {h.step_id for h in history[: number - 1]}
    undone = 0
    for record in history:
        if record.kind == COMPENSATION_EXECUTED:
            comp_id = record.step_id.removeprefix(_COMPENSATION_STEP_PREFIX)
            undone += comp_id.removeprefix(ON_FAILURE_PREFIX) in kept
    return undone


async def fork_instance(
    conn: Executor,
    row: InstanceRow,
    step: str | int,
    arguments: Mapping[str, Any] | None = None,
    *,
    registry: Registry = REGISTRY,
) -> Fork:
    """Fork ``row`` at ``step``; ``arguments`` (keyword arguments) replace the input its
    replay sees, checked against the workflow's signature when this process knows it
    (``InvalidInputError``, as a start's). Call it in a transaction."""
    history = await forks_sql.fork_points(conn, row.id)  # numbers, ids and kinds: no payloads
    number = resolve_step(history, step)
    wf = registry.workflows.get(row.workflow_name)
    fork_id, input_json = f"{row.workflow_name}-{time_ordered_hex()}", None
    if arguments is not None:  # checked, and made JSON, as a start's input
        start = prepare_start(row.workflow_name, dict(arguments), registry=registry, flow_control=False)
        fork_id, input_json = start.instance.instance_id, start.instance.input_json
    forked = await forks_sql.instance_fork(
        conn,
        row.id,
        fork_id,
        number,
        input_json=input_json,
        source_hash=None if wf is None else wf.source_hash,  # the code that runs it, when known here
    )
    if forked is None:  # deleted since it was read
        raise WorkflowNotFoundError(f"no workflow instance {row.id!r}")
    return Fork(
        fork_id=forked.fork_id,
        original_id=row.id,
        step=number,
        step_id=history[number - 1].step_id,
        kept=forked.steps,
        undone=_undone(history, number),
    )


def fork_action(row: InstanceRow, fork: Fork, origin: str, actor: str, reason: str | None = None) -> OperatorAction:
    """The operator action log's record of a fork (target: the original)."""
    return OperatorAction(
        action="fork",
        origin=origin,
        actor=actor,
        target=row.id,
        affected=1,
        reason=reason,
        details={
            "workflow": row.workflow_name,
            "status": row.status,
            "fork_id": fork.fork_id,
            "step": fork.step,
            "step_id": fork.step_id,
            "kept": fork.kept,
            "message": fork.said(),
        },
    )
