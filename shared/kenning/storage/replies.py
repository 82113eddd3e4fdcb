"""SQL for requests with a reply (``Client.request``, ``ReceivedMessage.reply``).

A request is a message (``kenning.storage.messages``); its reply is a ``kenning_replies``
row keyed by (instance, message id), written in the transaction that records the
replying step (so it is stored exactly once) and read by the client waiting for it. The
insert notifies ``CHANNEL_RESULTS`` with the instance's id, as an instance's end does,
while any client listens: a client waiting in ``request`` is woken by either, and one
read of the instance's status and the reply tells which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kenning import codecs
from kenning.db import Executor, statement
from kenning.storage.names import notify_results

_REPLY_INSERT = statement(
    f"""
    WITH inserted AS (
        INSERT INTO kenning_replies (instance_id, message_id, value, error)
        VALUES (:instance_id, :message_id, CAST(:value AS jsonb), :error)
        ON CONFLICT (instance_id, message_id) DO NOTHING
        RETURNING instance_id AS id
    )
    SELECT EXISTS (SELECT FROM inserted) AS replied, {notify_results("inserted")} AS notified
    """
)


async def reply_insert(conn: Executor, *, instance_id: str, message_id: str, value: Any, error: str | None) -> bool:
    """Store the reply to ``instance_id``'s message ``message_id`` (``value``: JSON already,
    or ``error``: a refusal's reason), in the caller's transaction, notifying waiting
    clients at commit; False (nothing written) when it has a reply already."""
    params = {
        "instance_id": instance_id,
        "message_id": message_id,
        "value": None if error is not None else json.dumps(value),
        "error": error,
    }
    return bool((await conn.execute(_REPLY_INSERT, params)).one().replied)


@dataclass(frozen=True)
class RequestState:
    """What a client waiting for a reply reads, in one snapshot: the instance's status
    and its reply, if any (a reply commits before the instance can end)."""

    status: str
    replied: bool
    value: Any
    error: str | None


_REQUEST_STATE = statement(
    """
    SELECT i.status, r.message_id IS NOT NULL AS replied, r.value, r.error
    FROM kenning_instances AS i
    LEFT JOIN kenning_replies AS r ON r.instance_id = i.id AND r.message_id = :message_id
    WHERE i.id = :instance_id
    """
)


async def request_state(conn: Executor, *, instance_id: str, message_id: str) -> RequestState | None:
    """The instance's status and the reply to its message ``message_id``; None when there
    is no such instance."""
    row = (await conn.execute(_REQUEST_STATE, {"instance_id": instance_id, "message_id": message_id})).first()
    if row is None:
        return None
    return RequestState(status=row.status, replied=bool(row.replied), value=codecs.unseal(row.value), error=row.error)


@dataclass(frozen=True)
class StoredReply:
    message_id: str
    value: Any
    error: str | None


_REPLIES_OF = statement(
    """
    SELECT message_id, value, error FROM kenning_replies WHERE instance_id = :id ORDER BY replied_at, message_id
    """
)


async def replies_of(conn: Executor, instance_id: str) -> list[StoredReply]:
    """Every reply ``instance_id`` made, oldest first."""
    rows = await conn.execute(_REPLIES_OF, {"id": instance_id})
    return [StoredReply(message_id=row.message_id, value=codecs.shown(row.value), error=row.error) for row in rows]
