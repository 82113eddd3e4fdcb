"""Version 1 of an app, for a fleet in a rolling deploy: it knows the ``shipment.sent``
waiter but not the ``parcel.registered`` workflow or the ``audit.logged`` handler that
version 2 (``tests.apps.versions_new``) adds."""

from __future__ import annotations

from kenning import App, WorkflowContext, activity, wait_event, workflow
from tests.sidechannel import record_execution

app = App("kenning-versions-tests")


@activity
async def noted(ctx: WorkflowContext, label: str) -> str:
    record_execution(f"{label} {ctx.instance_id}")
    return label


@workflow
async def await_shipment(ctx: WorkflowContext, order_id: str) -> str:
    """Waits for its ``shipment.sent``: any worker may deliver it (the wait is in the database)."""
    sent = await wait_event(ctx, "shipment.sent", match={"order_id": order_id}, timeout_seconds=600)
    return str(sent.data["carrier"])
