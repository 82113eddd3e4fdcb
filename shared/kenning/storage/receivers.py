"""SQL for the receivers of event types across every version of the app a fleet runs.

A worker's inbox loop declares what its app receives (``Receiver``: an ``event_handler``
workflow or an ``on_event`` handler, by event type) at start and renews it while it runs
(``receivers_declare``). An inbox claim takes an event only if the claiming worker has
every receiver of its type declared within the time-to-live (``FOREIGN_TYPES``): in a
fleet on two versions of the app, a worker that lacks a receiver leaves the event to
one that has it, and the event waits while no such worker runs. A receiver no worker has
declared for the time-to-live is retired: its version is gone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kenning.db import Executor, statement

WORKFLOW = "workflow"  # an event_handler workflow, started by each event of its type
HANDLER = "handler"  # an on_event handler, run once per event of its type


@dataclass(frozen=True, order=True)
class Receiver:
    event_type: str
    kind: str  # WORKFLOW or HANDLER
    name: str  # the workflow's name, or the handler's qualified name

    def as_json(self) -> dict[str, str]:
        return {"event_type": self.event_type, "kind": self.kind, "name": self.name}


def receivers_json(receivers: Sequence[Receiver]) -> str:
    """The ``:mine`` parameter of the statements below: a worker's receivers."""
    return json.dumps([r.as_json() for r in receivers])


# The event types this worker must leave to others: one live receiver of theirs, declared
# by some worker within :receiver_ttl seconds, is not among :mine. A CTE of the inbox's
# statements, computed once per statement over the small receivers table.
FOREIGN_TYPES = """foreign_types AS MATERIALIZED (
        SELECT DISTINCT r.event_type
        FROM kenning_event_receivers AS r
        WHERE r.last_seen > now() - make_interval(secs => CAST(:receiver_ttl AS float8))
          AND NOT EXISTS (
              SELECT FROM jsonb_to_recordset(CAST(:mine AS jsonb)) AS m(event_type text, kind text, name text)
              WHERE m.event_type = r.event_type AND m.kind = r.kind AND m.name = r.name)
    )"""

# the inbox rows a worker may claim: cancellations, and events of no foreign type
CLAIMABLE = "(x.kind <> 'event' OR x.event_type <> ALL(ARRAY(SELECT event_type FROM foreign_types)))"

_RECEIVERS_DECLARE = statement(
    """
    INSERT INTO kenning_event_receivers AS r (event_type, kind, name)
    SELECT d.event_type, d.kind, d.name
    FROM jsonb_to_recordset(CAST(:mine AS jsonb)) AS d(event_type text, kind text, name text)
    ORDER BY d.event_type, d.kind, d.name
    ON CONFLICT (event_type, kind, name) DO UPDATE SET last_seen = now()
    """
)


async def receivers_declare(conn: Executor, receivers: Sequence[Receiver]) -> None:
    """Declare (or renew) a worker's receivers in one statement, in a stable order so
    two workers declaring the same rows never deadlock."""
    if receivers:
        await conn.execute(_RECEIVERS_DECLARE, {"mine": receivers_json(sorted(receivers))})


@dataclass(frozen=True)
class DeclaredReceiver:
    receiver: Receiver
    first_seen: datetime
    last_seen: datetime
    live: bool  # declared within the time-to-live


_RECEIVERS_LIST = statement(
    """
    SELECT event_type, kind, name, first_seen, last_seen,
           last_seen > now() - make_interval(secs => CAST(:receiver_ttl AS float8)) AS live
    FROM kenning_event_receivers
    ORDER BY event_type, kind, name
    """
)


async def receivers_list(conn: Executor, receiver_ttl: float) -> list[DeclaredReceiver]:
    rows = await conn.execute(_RECEIVERS_LIST, {"receiver_ttl": receiver_ttl})
    return [
        DeclaredReceiver(Receiver(row.event_type, row.kind, row.name), row.first_seen, row.last_seen, bool(row.live))
        for row in rows
    ]
