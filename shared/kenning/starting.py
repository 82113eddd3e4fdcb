"""Preparing a start: what a client's ``start()``, a child's start, an event that starts a
workflow and a cron tick all check before anything is written.

``prepare_start`` turns what the caller has into a ``Start``: the instance id (given, or
``<workflow>-<uuid>``), the input serialized to JSON, checked storable and bound to the
workflow's signature, the idempotency key, the queue, and the workflow's definition row.
No I/O: the engine prepares a child's start with it, and ``kenning.client.starts``
inserts what it returns.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic

from typing_extensions import TypeVar

from kenning import serialization
from kenning.core.limits import MAX_ID_LENGTH
from kenning.core.published import check_key, search_text
from kenning.core.records import Definition, NewInstance
from kenning.core.texts import check_text
from kenning.errors import ConfigurationError, KenningError
from kenning.flow import BatchedEvent, Debounce, DebouncedStart
from kenning.observability import tracing
from kenning.queues import check_priority, check_queue_name
from kenning.registry import REGISTRY, Registry
from kenning.workflow import Workflow

DefinitionKey = tuple[str, str]  # (workflow name, source hash)

# the started workflow's result type, for Client.result (defaulted: a bare StartedInstance is Any)
R = TypeVar("R", default=Any)


class InvalidInputError(KenningError, TypeError):
    """``start()`` arguments that do not fit the workflow's signature or types (a
    ``TypeError``, as a call with the wrong arguments would be)."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = message if detail is None else detail  # what is wrong, without the workflow's name


@dataclass(frozen=True)
class StartedInstance(Generic[R]):
    instance_id: str
    created: bool  # False when the instance id or idempotency key already existed, or a singleton key's ran
    # True when its queue's partition_strategy cancel_newest ended it at once (its key at its limit)
    cancelled: bool = False


@dataclass(frozen=True)
class Start:
    """A start checked and ready to insert."""

    instance: NewInstance
    definition: Definition | None  # None: a workflow this process has no code for
    debounce: DebouncedStart | None = None  # folded into its key's burst (kenning/flow.py)
    batch: BatchedEvent | None = None  # an event added to its key's batch (kenning/flow.py)

    @property
    def definition_key(self) -> DefinitionKey | None:
        return None if self.definition is None else (self.definition.workflow_name, self.definition.source_hash)


def time_ordered_hex() -> str:
    """A new instance id's 32 hex digits, laid out as a UUIDv7 (RFC 9562): 48 bits of Unix
    milliseconds first, then version, variant and 74 random bits. Ids that sort by creation
    time put new rows at the right edge of every index led by the instance id (instances,
    history, timers, subscriptions), so a worker's writes touch the same few recent index
    pages however many finished instances the tables hold; random ids spread them over the
    whole index: with 1M finished instances, up to two page reads and two full-page WAL
    images per workflow after each checkpoint (docs/performance.md, "Scale")."""
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | secrets.randbits(12) << 64
    value |= 0b10 << 62 | secrets.randbits(62)
    return f"{value:032x}"


def _invalid(workflow_name: str, detail: str) -> InvalidInputError:
    return InvalidInputError(f"invalid input for workflow {workflow_name!r}: {detail}", detail)


def _check_storable(what: str, value: str | None) -> None:
    if value is None:
        return
    if "\x00" in value or len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} must be at most {MAX_ID_LENGTH} characters with no NUL character")
    check_text(what, value)  # a lone surrogate


def prepare_start(
    workflow: Workflow[Any] | str,
    arguments: dict[str, Any],
    *,
    instance_id: str | None = None,
    idempotency_key: str | None = None,
    not_before: datetime | None = None,
    own_ids: bool = False,
    registry: Registry = REGISTRY,
    queue: str | None = None,
    partition_key: str | None = None,
    priority: int | None = None,
    timeout: float | None = None,
    search_attributes: Mapping[str, Any] | None = None,
    debounce: Debounce | None = None,
    flow_control: bool = True,
) -> Start:
    """``arguments`` (Python values, or JSON already) as the workflow's input. Raises
    ``InvalidInputError`` for an id or key PostgreSQL cannot index, an input it cannot
    store, or one the workflow's signature refuses; a workflow this process does not
    know (a name only) is started with its input unchecked. ``own_ids``: the id and key
    are Kenning's own (an event's, a tick's), not a caller's, and not held to the length
    a caller's are. ``queue`` (else the workflow's ``@workflow(queue=...)``) puts it in a
    queue with limits (kenning/queues.py), with a ``partition_key`` and a ``priority``
    (lower runs first) there. ``timeout`` (seconds; else the workflow's
    ``@workflow(timeout=...)``) sets the instance's deadline. ``search_attributes`` (keys
    the workflow declares in ``@workflow(search_attributes=...)``) are written with the row.
    ``debounce`` (else the workflow's ``@workflow(debounce=...)``, unless ``flow_control``
    is false: a child's start) folds it into its key's burst (kenning/flow.py)."""
    wf = workflow if isinstance(workflow, Workflow) else registry.workflows.get(workflow)
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    queue_name = _queue_of(wf, queue, partition_key, priority)
    if not own_ids:
        try:
            _check_storable("instance id", instance_id)
            _check_storable("idempotency key", idempotency_key)
        except ValueError as error:
            raise InvalidInputError(str(error)) from None
    input_json = serialization.to_json(arguments)
    reason = serialization.unstorable_reason(input_json)
    if reason is not None:  # jsonb refuses it: say so now, not as a failed batch of starts
        raise _invalid(name, f"it cannot be stored: {reason}")
    if wf is not None:
        try:
            serialization.signature(wf.func).bind(None, **serialization.bind_arguments(wf.func, input_json))
        except (TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            raise _invalid(name, str(error)) from None
    if queue_name is not None and partition_key is None:
        partition_key = _key_from_input(registry, queue_name, name, input_json)
    debounced = _debounced(wf, name, arguments, debounce if flow_control else None, flow_control and not_before is None)
    if debounced is not None and not own_ids and (instance_id is not None or idempotency_key is not None):
        raise InvalidInputError("instance_id= and idempotency_key= do not apply to a debounced start")
    instance = NewInstance(
        instance_id=(None if debounced is not None and own_ids else instance_id) or f"{name}-{time_ordered_hex()}",
        workflow_name=name,
        source_hash=wf.source_hash if wf is not None else "",
        input_json=input_json,
        idempotency_key=None if debounced is not None else idempotency_key,
        not_before=not_before,
        trace_context=tracing.current_carrier(),
        queue_name=queue_name,
        partition_key=partition_key,
        priority=0 if priority is None else priority,
        timeout_seconds=timeout if timeout is not None else (wf.timeout if wf is not None else None),
        search_attributes=_checked_search_attributes(wf, name, search_attributes),
        delay_seconds=None if debounced is None else debounced.period,
    )
    definition = None if wf is None else Definition(name, wf.source_hash, wf.source, wf.retention_seconds)
    return Start(instance, definition, debounce=debounced)


def _debounced(
    wf: Workflow[Any] | None, name: str, arguments: Mapping[str, Any], given: Debounce | None, declared: bool
) -> DebouncedStart | None:
    """The start's place in a burst: ``given``, else the workflow's declared debounce."""
    chosen = given if given is not None else (wf.debounce if wf is not None and declared else None)
    if chosen is None:
        return None
    try:
        return DebouncedStart(chosen.key_of(arguments), chosen.period, chosen.max_wait)
    except Exception as error:  # the user's key function, or a field the input lacks
        raise _invalid(name, str(error)) from None


def _key_from_input(registry: Registry, queue_name: str, name: str, input_json: Any) -> str | None:
    """The partition key a queue's ``partition_rate_limit=RateLimit(key=field)`` takes from
    the start's input, if this process knows the queue's declaration: the field's value as
    text (a string as it is, anything else as its JSON)."""
    declared = registry.queues.get(queue_name)
    limit = None if declared is None else declared.partition_rate_limit
    if limit is None or limit.key is None:
        return None
    if not isinstance(input_json, dict) or input_json.get(limit.key) is None:
        raise _invalid(name, f"queue {queue_name!r} takes its partition key from input field {limit.key!r}: none given")
    value = input_json[limit.key]
    key = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    try:
        _check_storable("partition key", key)
    except ValueError as error:
        raise _invalid(name, str(error)) from None
    return key


def _checked_search_attributes(
    wf: Workflow[Any] | None, name: str, given: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """A start's search attributes, each a key its workflow declares (any key when this
    process does not know the workflow) with a value a search attribute takes."""
    if not given:
        return None
    for key, value in given.items():
        try:
            check_key(key)
            if wf is not None and key not in wf.search_attributes:
                declared = ", ".join(sorted(wf.search_attributes)) or "none"
                raise ValueError(f"search attribute {key!r} is not declared by the workflow (declared: {declared})")
            if search_text(key, value) is None:
                raise ValueError(f"search attribute {key!r} needs a value at start, not None")
        except (TypeError, ValueError) as error:
            raise _invalid(name, str(error)) from None
    return dict(given)


def _queue_of(
    wf: Workflow[Any] | None, queue: str | None, partition_key: str | None, priority: int | None
) -> str | None:
    """The queue a start goes to, its partition key and priority checked: refused with
    ``InvalidInputError`` (a caller's mistake, as a wrong argument is)."""
    queue_name = queue if queue is not None else (wf.queue if wf is not None else None)
    try:
        if queue is not None:
            check_queue_name(queue)
        _check_storable("partition key", partition_key)
        if priority is not None:
            check_priority(priority)
    except (ConfigurationError, ValueError) as error:
        raise InvalidInputError(str(error)) from None
    if queue_name is None and (partition_key is not None or priority is not None):
        raise InvalidInputError("partition_key= and priority= apply to a queue: pass queue= too")
    return queue_name
