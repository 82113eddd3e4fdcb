"""``Debounce`` and ``Batch`` (kenning/flow.py): a declaration that cannot work is refused
at import with one line naming the problem; a start's key is read from its input."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kenning import Batch, ConfigurationError, Debounce, WorkflowContext
from kenning.starting import InvalidInputError, prepare_start
from kenning.workflow import Workflow


async def _saves(ctx: WorkflowContext, document_id: str, revision: int) -> int:
    return revision


async def _readings(ctx: WorkflowContext, events: list[dict[str, Any]]) -> int:
    return len(events)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Debounce(key="d", period=0), "Debounce period= must be a positive number"),
        (lambda: Debounce(key="d", period=float("nan")), "Debounce period= must be a positive number"),
        (lambda: Debounce(key="d", period=5, max_wait=1), "max_wait= (1.0) must be at least period= (5.0)"),
        (lambda: Debounce(key="", period=5), "key= must be an input field's name or a function"),
        (lambda: Batch(max_size=0, max_wait=1), "Batch max_size= must be an int from 1 to 100000"),
        (lambda: Batch(max_size=10, max_wait=-1), "Batch max_wait= must be a positive number"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        make()


def test_a_batch_needs_an_event_handler_with_an_events_parameter() -> None:
    with pytest.raises(ConfigurationError, match="batch= needs event_handler=True"):
        Workflow(_readings, name="r1", batch=Batch(max_size=2, max_wait=1))
    with pytest.raises(ConfigurationError, match="batch= needs a parameter 'events'"):
        Workflow(_saves, name="r2", event_handler=True, batch=Batch(max_size=2, max_wait=1))
    with pytest.raises(ConfigurationError, match="debounce= and batch= do not go together"):
        Workflow(
            _readings,
            name="r3",
            event_handler=True,
            batch=Batch(max_size=2, max_wait=1),
            debounce=Debounce(key="x", period=1),
        )


def test_a_start_s_key_is_a_field_or_a_function_of_its_input() -> None:
    saves = Workflow(_saves, name="saves", debounce=Debounce(key="document_id", period=2, max_wait=9))
    start = prepare_start(saves, {"document_id": "d-1", "revision": 3})
    assert start.debounce is not None
    assert (start.debounce.key, start.debounce.period, start.debounce.max_wait) == ("d-1", 2, 9)
    assert start.instance.delay_seconds == 2 and start.instance.idempotency_key is None
    by_function = saves.options(debounce=Debounce(key=lambda data: f"r{data['revision']}", period=1))
    assert prepare_start(by_function, {"document_id": "d", "revision": 4}, debounce=by_function.start_options.debounce)
    by_number = prepare_start(saves, {"document_id": "d", "revision": 7}, debounce=Debounce(key="revision", period=1))
    assert by_number.debounce is not None and by_number.debounce.key == "7"  # a key is text
    with pytest.raises(InvalidInputError, match="do not apply to a debounced start"):
        prepare_start(saves, {"document_id": "d", "revision": 1}, idempotency_key="k")
    # a child's start (and continue_as_new's) is never folded
    assert prepare_start(saves, {"document_id": "d", "revision": 1}, flow_control=False).debounce is None
