"""Workflows under flow control per key (tests/system/test_flow.py): debounced starts from a
client and from CloudEvents, and event batches."""

from __future__ import annotations

import asyncio
from typing import Any

from kenning import App, Batch, Debounce, WorkflowContext, workflow

app = App("kenning-flow")

# long enough that a test's burst of starts is one burst on a loaded machine
BURST_PERIOD = 2.0


@workflow(debounce=Debounce(key="document_id", period=BURST_PERIOD, max_wait=30))
async def save_document(ctx: WorkflowContext, document_id: str, version: int) -> dict[str, Any]:
    return {"document_id": document_id, "version": version}


# a burst two CLI starts join however slowly this machine starts each command
@workflow(debounce=Debounce(key="document_id", period=60, max_wait=120))
async def save_draft(ctx: WorkflowContext, document_id: str, version: int) -> dict[str, Any]:
    return {"document_id": document_id, "version": version}


@workflow(name="doc.edited", event_handler=True, debounce=Debounce(key=lambda d: d["doc"], period=BURST_PERIOD))
async def doc_edited(ctx: WorkflowContext, doc: str, n: int) -> dict[str, Any]:
    return {"doc": doc, "n": n}


@workflow(name="reading.taken", event_handler=True, batch=Batch(max_size=5, max_wait=1.0, key="tenant"))
async def readings(ctx: WorkflowContext, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return events


@workflow
async def flow_quick(ctx: WorkflowContext, seconds: float) -> float:
    await asyncio.sleep(seconds)  # not a step: the run just ends a moment after its claim
    return seconds


@workflow(name="reading.gathered", event_handler=True, batch=Batch(max_size=100, max_wait=600, key="tenant"))
async def gathered(ctx: WorkflowContext, events: list[dict[str, Any]]) -> int:
    return len(events)  # a batch that gathers for the whole test: kenning why explains it
