"""Child workflows: ``start_child`` and ``ChildHandle.result``, after Temporal's.

``await start_child(ctx, wf, **kwargs)`` starts ``wf`` as a child of the running workflow
and returns its handle; the start is a step, recorded in the transaction that inserts the
child, so a replay returns the same child and a crash never starts two.
``await handle.result()`` waits for the child's end without holding a worker (the child's
end wakes the parent, kenning.storage.children) and returns its result; a child that
failed or was cancelled raises ``ChildWorkflowFailed`` here, so the parent's own
compensations apply unless it catches it.

``on_parent_cancel``: what the parent's end does to the child while it is unfinished,
despite its name not only a cancellation: it applies however the parent ends (cancelled,
failed, or completed without waiting for the child), as Temporal's parent close policy
does. ``"cancel"`` (the default) requests the child's cancellation, so its compensations
run; ``"abandon"`` leaves it running. The request is written by the statement that ends
the parent, so after the parent's own compensations have run. A crash loop the claim parks
is not an end (``kenning instances retry`` resumes it): a parked parent's children keep
running, and a parked child's end reaches its waiting parent through the stuck check.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Generic, overload

from typing_extensions import ParamSpec, TypeVar

from kenning import codecs, serialization
from kenning.context import ChildOptions, WorkflowContext
from kenning.core.names import ON_PARENT_CANCEL
from kenning.errors import ChildStartRefused, ChildWorkflowFailed
from kenning.workflow import Workflow

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

# the keywords start_child takes as its own options, beside the child's arguments
_CHILD_OPTIONS = ("child_id", "on_parent_cancel", "queue", "partition_key", "priority")

__all__ = ["ChildHandle", "ChildStartRefused", "ChildWorkflowFailed", "start_child"]


@dataclass(frozen=True)
class ChildHandle(Generic[T]):
    """A started child: its instance id, and ``result()`` to wait for its end."""

    ctx: WorkflowContext
    workflow: Workflow[T]
    child_id: str
    step_id: str  # the parent's step that started it

    async def result(self) -> T:
        """The child's result once it completed; raises ``ChildWorkflowFailed`` if it
        failed or was cancelled."""
        record = await self.ctx.runtime.wait_child(self.step_id, self.child_id, self.workflow.name)
        data = codecs.unseal((record.payload or {}).get("data")) or {}
        status = str(data.get("status"))
        if status != "completed":
            # the child's traceback stays on the child: the parent's error has its own
            error = data.get("error")
            if isinstance(error, dict):
                error = {k: v for k, v in error.items() if k != "traceback"}
            raise ChildWorkflowFailed(self.child_id, status, error, self.workflow.name)
        annotation = serialization.type_hints(self.workflow.func).get("return", inspect.Parameter.empty)
        result: T = serialization.from_json(data.get("result"), annotation)
        return result


@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: P.args, **kwargs: P.kwargs
) -> ChildHandle[R]: ...
# The options mixed with the arguments (the first form): the arguments are then unchecked
# (PEP 612 allows no keyword beside the child's own); one overload per option, each
# requiring it, so a start with none is checked above. Checked with options:
# start_child(ctx, wf.options(instance_id=..., on_parent_cancel=...), ...).
@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: Any, child_id: str | None, **kwargs: Any
) -> ChildHandle[R]: ...
@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: Any, on_parent_cancel: str, **kwargs: Any
) -> ChildHandle[R]: ...
@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: Any, queue: str | None, **kwargs: Any
) -> ChildHandle[R]: ...
@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: Any, partition_key: str | None, **kwargs: Any
) -> ChildHandle[R]: ...
@overload
async def start_child(
    ctx: WorkflowContext, workflow: Workflow[R, P], /, *args: Any, priority: int | None, **kwargs: Any
) -> ChildHandle[R]: ...
async def start_child(ctx: WorkflowContext, workflow: Workflow[Any], /, *args: Any, **kwargs: Any) -> ChildHandle[Any]:
    """Start ``workflow(*args, **kwargs)`` as a child of this workflow and return its handle.

    Its options, given with ``workflow.options(...)`` (checked) or as keywords here:
    ``child_id`` (or ``.options(instance_id=...)``): the child's instance id (default: a
    new one, fixed by the recorded step); starting with an id this parent's child already
    has returns that child, an id some other instance has raises ``ChildStartRefused``.
    ``on_parent_cancel``: ``"cancel"`` (the default) or ``"abandon"`` (the module's
    docstring). ``queue``, ``partition_key`` and ``priority`` as in ``Client.start``: a
    child runs in its workflow's ``@workflow(queue=...)`` (or ``queue``) under that queue's
    limits, as any start does. A child has its workflow's ``@workflow(timeout=...)``, or
    ``.options(timeout=...)``'s, counted from its own start."""
    if not isinstance(workflow, Workflow):
        raise TypeError(f"start_child takes a @workflow, got {workflow!r}")
    given = {name: kwargs.pop(name) for name in _CHILD_OPTIONS if name in kwargs}
    child_id = given.pop("child_id", None)
    options = workflow.start_options.merged(instance_id=child_id, **given)
    if options["idempotency_key"] is not None:
        raise TypeError(
            "start_child: idempotency_key= applies to Client.start; a child's id is .options(instance_id=...)"
        )
    on_parent_cancel = options["on_parent_cancel"] or "cancel"
    if on_parent_cancel not in ON_PARENT_CANCEL:
        raise ValueError(f"on_parent_cancel must be one of {', '.join(ON_PARENT_CANCEL)}, got {on_parent_cancel!r}")
    child_options = ChildOptions(
        child_id=options["instance_id"],
        on_parent_cancel=on_parent_cancel,
        queue=options["queue"],
        partition_key=options["partition_key"],
        priority=options["priority"],
        timeout=options["timeout"],
        search_attributes=options["search_attributes"],
    )
    child, step_id = await ctx.runtime.start_child(workflow, workflow.named_arguments(args, kwargs), child_options)
    return ChildHandle(ctx, workflow, child, step_id)
