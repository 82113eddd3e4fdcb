"""Published values in the replay engine: ``publish_value`` and ``set_status`` as a
``WorkflowRun`` runs them (kenning/messages.py's SDK functions).

Publishing is a step (``publish_value:<n>``, named ``publish_value:<key>``, kind
``ValuePublished``) whose record and the value commit together (``PublishValue``):
replay writes nothing again. A key the workflow declares in ``search_attributes`` is
indexed as text too (``search_text``), in the same write.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kenning import serialization
from kenning.context import current_step
from kenning.core.limits import MAX_VALUE_CHARS
from kenning.core.names import VALUE_PUBLISHED
from kenning.core.published import check_key, search_text
from kenning.engine.commands import PublishValue
from kenning.engine.history import StepRecord
from kenning.errors import UnstorableValueError
from kenning.objects import payloads

if TYPE_CHECKING:
    from kenning.engine.run import WorkflowRun

PUBLISH_VALUE_STEP = "publish_value"


def storable_value(key: str, value: Any) -> Any:
    """The value as JSON, checked storable and at most ``MAX_VALUE_CHARS`` of JSON."""
    stored = serialization.storable_json(value, f"published value {key!r}")
    size = len(json.dumps(stored))
    if size > MAX_VALUE_CHARS:
        raise UnstorableValueError(payloads.too_large(f"published value {key!r}", size, MAX_VALUE_CHARS))
    return stored


async def publish_value(run: WorkflowRun, key: str, value: Any) -> None:
    """Publish now, unless replay finds the step recorded (then nothing is written)."""
    if current_step.get() is not None:
        raise RuntimeError("publish_value and set_status belong in workflow code, not in an activity or compensation")
    check_key(key)
    step_name = f"{PUBLISH_VALUE_STEP}:{key}"
    step_id = run.cursor.next_step_id(PUBLISH_VALUE_STEP)
    if run.cursor.take(step_id, step_name) is not None:
        return
    searchable = key in run.workflow.search_attributes
    stored = storable_value(key, value)  # first: a NUL or lone surrogate is UnstorableValueError
    text = search_text(key, value) if searchable else None
    await run.before_new_step(step_id, step_name, flush=False)  # the port folds it in
    record = StepRecord(step_id, VALUE_PUBLISHED, step_name, {"key": key})
    await run.folded(run.port.publish_value(PublishValue(record, key, stored, searchable, text)))
    run.log.debug("value.published", step=step_id, key=key, searchable=searchable)
