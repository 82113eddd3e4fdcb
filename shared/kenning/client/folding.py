"""Folding a start into its key's burst or batch (kenning/flow.py): the start path of a
debounced start (a client's, an event's) and of an event for a batch workflow.

In the caller's transaction: the key's lock, then the join (``kenning/storage/flow.py``);
when the key has no open burst, the insert of a new instance due after the period (or
the batch's ``max_wait``) and its burst row. The caller learns the instance it is in:
``created`` is True for the start that opened it.
"""

from __future__ import annotations

from dataclasses import replace

import structlog

from kenning.core.records import StartOutcome
from kenning.db import Executor
from kenning.observability import metrics
from kenning.starting import DefinitionKey, Start, StartedInstance
from kenning.storage import definitions as definitions_sql
from kenning.storage import flow as flow_sql
from kenning.storage import instances as instances_sql

_log = structlog.get_logger("kenning.starting")


def folds(start: Start) -> bool:
    return start.debounce is not None or start.batch is not None


async def fold_on(
    conn: Executor, start: Start, *, known: set[DefinitionKey], registered: list[DefinitionKey]
) -> StartedInstance:
    """Fold ``start`` into its key's open burst or batch, or open one; inside a transaction
    (the definitions written are listed in ``registered``, known once it commits)."""
    new = start.instance
    name = new.workflow_name
    debounce, batch = start.debounce, start.batch
    kind = flow_sql.DEBOUNCE if debounce is not None else flow_sql.BATCH
    key = debounce.key if debounce is not None else batch.key if batch is not None else ""
    await flow_sql.flow_lock(conn, name, key)
    if debounce is not None:
        joined = await flow_sql.debounce_join(
            conn, name, key, new.input_json, debounce.period, debounce.max_wait, debounce.seq
        )
    else:
        assert batch is not None
        joined = await flow_sql.batch_append(conn, name, key, batch.seq, batch.data)
    if joined is not None:
        metrics.FOLDED_STARTS.labels(kind, "joined").inc()
        _log.debug("start.folded", instance_id=joined, workflow=name, kind=kind, key=key)
        return StartedInstance(joined, False)
    definition_key = start.definition_key
    if start.definition is not None and definition_key is not None and definition_key not in known:
        await definitions_sql.definitions_register(conn, [start.definition])
        registered.append(definition_key)
    if batch is not None:  # due when max_wait has passed, or at once if one event fills it
        new = replace(new, delay_seconds=None if batch.max_size == 1 else batch.max_wait)
    (outcome,) = await instances_sql.instances_start(conn, [new])
    if outcome is not StartOutcome.STARTED:  # a fresh time-ordered id: only a broken clock repeats one
        raise RuntimeError(f"instance {new.instance_id} of a new {kind} exists already")
    await flow_sql.burst_open(
        conn,
        instance_id=new.instance_id,
        kind=kind,
        workflow_name=name,
        key=key,
        period=None if debounce is None else debounce.period,
        max_wait=debounce.max_wait if debounce is not None else batch.max_wait if batch is not None else None,
        max_size=None if batch is None else batch.max_size,
        seq=batch.seq if batch is not None else debounce.seq if debounce is not None else None,
    )
    metrics.FOLDED_STARTS.labels(kind, "opened").inc()
    _log.debug("start.burst_opened", instance_id=new.instance_id, workflow=name, kind=kind, key=key)
    return StartedInstance(new.instance_id, True)
