"""Edda's ``EddaApp``: Kenning's ``App`` with what Edda's examples use of Edda's in-process
app and Kenning has with the same meaning: ``app.storage`` (an instance's status and
result, the outbox's pending events) and ``handle_cloudevent`` (an event into the inbox, as
the ingress accepts it; a worker delivers it)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from kenning.app import App
from kenning.compat.edda.storage import Storage
from kenning.storage import inbox as inbox_sql


class EddaApp(App):
    @property
    def storage(self) -> Storage:
        return Storage()

    async def handle_cloudevent(self, event: Any, wait: bool = False) -> None:
        """Store ``event`` (a CloudEvent of the ``cloudevents`` SDK, 1.x or 2.x API, or a
        dict of its attributes and ``data``) in the inbox, as ``kenning ingress`` does; a
        worker delivers it (``wait_event``, event handlers). Edda ran the handlers in this
        process; ``wait=True`` asked to wait for them, which Kenning cannot: refused."""
        if wait:
            raise NotImplementedError(
                "handle_cloudevent(wait=True): a worker delivers the event; wait for the instance with "
                "kenning.Client(url).result(instance_id) instead"
            )
        attributes, data = _parts(event)
        attributes.setdefault("specversion", "1.0")
        attributes.setdefault("id", str(uuid.uuid4()))
        for name in ("type", "source"):
            if not attributes.get(name):
                raise ValueError(f"handle_cloudevent: the event has no {name!r} attribute")
        new = inbox_sql.NewEvent(
            source=str(attributes["source"]),
            event_id=str(attributes["id"]),
            event_type=str(attributes["type"]),
            attributes=attributes,
            data=data,
            instance_id=attributes.get("kenninginstanceid"),
        )
        async with self.storage.client.database.connection() as conn:
            await inbox_sql.inbox_insert_events(conn, [new])


def _parts(event: Any) -> tuple[dict[str, Any], Any]:
    """The attributes (JSON-safe) and data of a CloudEvent or a dict."""
    if isinstance(event, dict):
        attributes = {k: v for k, v in event.items() if k != "data"}
        data = event.get("data")
    else:
        getter = getattr(event, "get_attributes", None)
        attributes = dict(getter() if getter is not None else event)  # 1.x's events are mappings
        data = event.get_data() if hasattr(event, "get_data") else getattr(event, "data", None)
    if isinstance(data, (bytes, bytearray)):
        data = json.loads(data)
    return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in attributes.items()}, data
