"""Child workflows in the replay engine: ``start_child`` and ``wait_child`` as a
``WorkflowRun`` runs them (its ``Runtime`` methods of those names call these).

Starting a child is a step (``start_child:<workflow>:<n>``, kind ``ChildStarted``) whose
record and the child's row commit together (``StartChild``): replay reads the child's
id back and starts nothing. Waiting for it is a step of its own (``<start step>:result``)
recorded as an ``EventReceived`` holding the child's end: taken at once when the child
has ended, else the parent suspends and the child's end wakes it (kenning.storage.children).
The engine does no I/O here either: it asks the port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kenning.context import ChildOptions
from kenning.core.records import HistoryRecord
from kenning.engine.commands import StartChild, WaitChild
from kenning.errors import ChildStartRefused
from kenning.observability import tracing
from kenning.starting import prepare_start  # the one start path

if TYPE_CHECKING:
    from kenning.engine.run import WorkflowRun
    from kenning.workflow import Workflow

START_STEP = "start_child"
RESULT_STEP = "child_result"


def result_step_id(start_step_id: str) -> str:
    """The step id of a child's result: derived from its start's, so each child has one."""
    return f"{start_step_id}:result"


async def start_child(
    run: WorkflowRun, workflow: Workflow[Any], arguments: dict[str, Any], options: ChildOptions
) -> tuple[str, str]:
    """(child id, start step id): the recorded ones on replay, else a new child's."""
    step_name = f"{START_STEP}:{workflow.name}"
    step_id = run.cursor.next_step_id(step_name)
    record = run.cursor.take(step_id, step_name)
    if record is not None:
        return str(record.payload["child_id"]), step_id
    await run.before_new_step(step_id, step_name, flush=False)
    # input checked and serialized as any start's (InvalidInputError is the workflow's error)
    start = prepare_start(
        workflow,
        arguments,
        instance_id=options.child_id,
        queue=options.queue,
        partition_key=options.partition_key,
        priority=options.priority,
        timeout=options.timeout,
        search_attributes=options.search_attributes,
        flow_control=False,  # a child starts when its parent says, never folded
    )
    new = start.instance
    command = StartChild(
        step_id=step_id,
        step_name=step_name,
        child_id=new.instance_id,
        workflow_name=new.workflow_name,
        source_hash=new.source_hash,
        input=new.input_json,
        on_parent_cancel=options.on_parent_cancel,
        trace_context=tracing.current_carrier(),
        queue_name=new.queue_name,
        partition_key=new.partition_key,
        priority=new.priority,
        timeout_seconds=new.timeout_seconds,
        search_attributes=new.search_attributes,
        pinned=workflow.versioning == "pinned",
    )
    started = await run.port.start_child(command)
    if started.cancel_requested:
        run.raise_if_cancelled()
    if not started.recorded:
        owner = f"a child of {started.taken_by}" if started.taken_by else "not a child of this instance"
        raise ChildStartRefused(f"instance {new.instance_id} exists and is {owner}: choose another child_id")
    run.log.debug("child.started", step=step_id, child_id=new.instance_id)
    return new.instance_id, step_id


async def wait_child(run: WorkflowRun, start_step_id: str, child_id: str, workflow_name: str) -> HistoryRecord:
    """The child's recorded end (``EventReceived``, its data the child's outcome); else
    wait for it without holding the worker."""
    step_name = f"{RESULT_STEP}:{workflow_name}"
    step_id = result_step_id(start_step_id)
    record = run.cursor.take(step_id, step_name)
    if record is not None:
        return record
    await run.before_new_step(step_id, step_name, flush=False)
    outcome = await run.port.wait_child(WaitChild(step_id, step_name, child_id))
    if isinstance(outcome, HistoryRecord):
        return outcome
    run.suspended(outcome, step_id, step_name)
