"""``kenning.testing``: test your own workflows, in memory or on PostgreSQL, with time that
skips (docs/testing.md).

    from datetime import timedelta
    from kenning.testing import WorkflowEnvironment

    async with WorkflowEnvironment() as env:  # in memory; database_url=... for PostgreSQL
        handle = await env.start(order_saga, order={...})
        await env.send_event("payment.completed", {"order_id": "o-1", "status": "approved"})
        await env.sleep(timedelta(minutes=11))
        assert (await handle.result())["tracking"] == "trk-o-1"

The pytest plugin (``kenning.testing.pytest_plugin``, registered as ``pytest11``) gives
the ``workflow_env`` fixture.
"""

from kenning.testing.environment import WaitsForeverError, WorkflowEnvironment, WorkflowHandle
from kenning.testing.state import HistoryEntry, InstanceState, OutgoingEvent

__all__ = [
    "HistoryEntry",
    "InstanceState",
    "OutgoingEvent",
    "WaitsForeverError",
    "WorkflowEnvironment",
    "WorkflowHandle",
]
