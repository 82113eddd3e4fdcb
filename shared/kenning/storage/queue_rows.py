"""A queue's row as starts keep it: created (without limits) by the first start into a
queue no worker declared, and naming each workflow ever started into it, which is how
workers find the queues to claim from (``queues.queue_names``).

A start's statement (``instances._INSTANCES_INSERT``, the child start) defines a CTE
``named (queue text, names text[])`` and then takes these pieces, so both keep the rows
alike: ``QUEUE_ROWS`` (the CTEs ``queues_created`` and ``queues_named``) and the main
query's columns ``QUEUES_NOTIFIED`` and ``QUEUES_UNSEEN``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kenning.core.names import CHANNEL_QUEUES
from kenning.db import Executor, statement
from kenning.storage.names import notify

# An existing row is neither written nor locked (no ON CONFLICT DO UPDATE): a start writes
# a queue's row only the first time it names a workflow there, so starts into one queue
# never wait on each other or on the queue's claims.
_QUEUES_NAMED = """UPDATE kenning_queues AS q
        SET workflow_names = ARRAY(SELECT DISTINCT w FROM unnest(q.workflow_names || n.names) AS w ORDER BY w)
        FROM named AS n
        WHERE q.name = n.queue AND NOT q.workflow_names @> n.names
        RETURNING q.name"""

QUEUE_ROWS = f"""queues_created AS (
        -- a queue no worker declared yet: created without limits, so its instances run
        -- (kenning/queues.py)
        INSERT INTO kenning_queues (name, workflow_names)
        SELECT queue, names FROM named
        ON CONFLICT DO NOTHING
        RETURNING name
    ), queues_named AS (
        -- the first start of a workflow into an existing queue adds its name (the workers
        -- knowing that workflow claim from the queue from then on); later ones write nothing
        {_QUEUES_NAMED}
    )"""

# Workers claim only from the queues they know, and the instances' NOTIFY alone would not
# make them read theirs again: a queue created or newly naming a workflow is announced
# at once (once per queue and workflow), whether or not the start's own NOTIFY is sent now.
QUEUES_NOTIFIED = f"""(SELECT {notify(CHANNEL_QUEUES)}
            FROM (SELECT name FROM queues_created UNION ALL SELECT name FROM queues_named) AS q
            LIMIT 1) AS queues_notified"""

# A queue the statement neither created nor sees: a concurrent start created it and
# committed after this snapshot (the INSERT waited for it and did nothing; the UPDATE,
# under the older snapshot, found no row). The caller then runs ``queues_name``.
QUEUES_UNSEEN = """EXISTS (SELECT FROM named AS n
                   WHERE NOT EXISTS (SELECT FROM queues_created AS c WHERE c.name = n.queue)
                     AND NOT EXISTS (SELECT FROM kenning_queues AS q WHERE q.name = n.queue)) AS queues_unseen"""

# This statement's snapshot is newer (READ COMMITTED, inside a transaction too) and sees
# the row. Rare, so ordinary starts keep neither locking nor writing an existing row.
_QUEUES_NAME = statement(
    f"""
    WITH named AS (
        SELECT s.queue, array_agg(DISTINCT s.name ORDER BY s.name) AS names
        FROM jsonb_to_recordset(CAST(:named AS jsonb)) AS s(queue text, name text)
        GROUP BY s.queue
    ), queues_named AS (
        {_QUEUES_NAMED}
    )
    SELECT (SELECT {notify(CHANNEL_QUEUES)} FROM queues_named LIMIT 1) AS queues_notified
    """
)


async def queues_name(conn: Executor, named: Iterable[tuple[str, str]]) -> None:
    """Name each (queue, workflow) pair's workflow in its queue, if it is not named yet:
    after a start whose statement reported the queue row unseen (``queues_unseen``)."""
    payload = [{"queue": queue, "name": name} for queue, name in named]
    await conn.execute(_QUEUES_NAME, {"named": json.dumps(payload)})
