"""Version 2 of ``tests.apps.versions_old``: the same workflows, and an ``event_handler``
workflow for ``parcel.registered`` and an ``on_event`` handler for ``audit.logged``."""

from __future__ import annotations

from kenning import ReceivedEvent, WorkflowContext, workflow
from tests.apps.versions_old import app, await_shipment, noted
from tests.sidechannel import record_execution

__all__ = ["app", "await_shipment", "parcel_registered"]


@workflow(event_handler=True, name="parcel.registered")
async def parcel_registered(ctx: WorkflowContext, parcel: str) -> str:
    return await noted(ctx, f"parcel:{parcel}")


@app.on_event("audit.logged")
async def audit(event: ReceivedEvent) -> None:
    record_execution(f"audit {event.data['entry']}")
