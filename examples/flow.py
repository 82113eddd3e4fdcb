"""Flow control per key (docs/workflows.md, "Flow control per key"): a burst of saves of one
document is one indexing run, with the last save's revision.

kenning worker --app examples.flow      # in one terminal
python -m examples.flow                 # in another: ten saves, one instance, its result
"""

from __future__ import annotations

import asyncio
from typing import Any

from kenning import Batch, Client, Debounce, WorkflowContext, activity, workflow


@activity
async def index(ctx: WorkflowContext, document_id: str, revision: int) -> int:
    return revision  # a search index would be written here, once per burst


@workflow(debounce=Debounce(key="document_id", period=1, max_wait=10))
async def index_saved_document(ctx: WorkflowContext, document_id: str, revision: int) -> int:
    return await index(ctx, document_id, revision)


@workflow(name="meter.reading", event_handler=True, batch=Batch(max_size=100, max_wait=2, key="tenant"))
async def store_readings(ctx: WorkflowContext, events: list[dict[str, Any]]) -> int:
    return len(events)  # POST readings to `kenning ingress`: one instance per 100, or per 2 s


async def main() -> None:
    async with Client() as client:  # KENNING_DATABASE_URL
        started = [await client.start(index_saved_document, document_id="doc-1", revision=r) for r in range(10)]
        ids = {s.instance_id for s in started}
        print(f"10 saves joined {len(ids)} instance:", *ids)
        print("indexed revision", await client.result(started[0].instance_id, timeout=30))


if __name__ == "__main__":
    asyncio.run(main())
