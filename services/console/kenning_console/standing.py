"""Where an instance stands, for its page: the actions accepted on it now, its parent and
children, and what it waits for.

- **Offers.** ``kenning.commands.steering.offers``: the refusal each action would meet
  (None: accepted), judged as the action itself judges it, so the page offers Retry only
  where a retry is taken. The page is rendered again on every live update, so its buttons
  follow the instance (a cancelled instance keeps no Cancel).
- **Family.** ``start_child``'s links, both ways: the parent (with the step that started
  this child) and the children, oldest first.
- **Waits.** ``kenning why``'s reading of the instance (``why.explain_on``): the event, the
  message topic, the timer, the child it waits for, a queue key's slot or rate window or a
  debounced burst, and its judgement of what moves it on, in ``kenning why``'s words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kenning.commands import steering, why
from kenning.core.names import CHILD_EVENT_TYPE
from kenning.core.records import TERMINAL_STATUSES
from kenning.db import Executor
from kenning.storage import children as children_sql

CHILDREN_SHOWN = 200  # the oldest children listed; kenning instances show lists them all


@dataclass(frozen=True)
class PageRow:
    """What the refusals read of the page's bounded row: its error only as its reason."""

    id: str
    status: str
    cancel_requested: bool
    error: dict[str, Any] | None


def steered(row: Any) -> PageRow:
    """The refusals' view of the page's row (``kenning.storage.console.instance``)."""
    error = None if row.error_size is None else {"reason": row.error_reason}
    return PageRow(row.id, row.status, bool(row.cancel_requested), error)


async def standing(conn: Executor, row: Any, *, commit_stall_seconds: float) -> dict[str, Any]:
    """The page's offers, family and waits (see the module's docstring)."""
    refusals = await steering.offers(conn, steered(row))
    parent = await children_sql.parent_of(conn, row.id)
    children = await children_sql.children_of(conn, row.id, limit=CHILDREN_SHOWN + 1)
    explained = None
    if row.status not in TERMINAL_STATUSES:  # a finished instance waits for nothing
        explained = await why.explain_on(conn, row.id, commit_stall_seconds=commit_stall_seconds)
    return {
        "offers": {action: refused is None for action, refused in refusals.items()},
        "refusals": refusals,
        "parent": None if parent is None else {"id": parent[0], "step": parent[1], "policy": parent[2]},
        "children": children[:CHILDREN_SHOWN],
        "more_children": len(children) > CHILDREN_SHOWN,
        "waiting_on": waits(explained) if explained is not None else [],
        "why": explained,
        "why_lines": why.lines(explained) if explained is not None else [],
    }


def waits(info: dict[str, Any]) -> list[dict[str, Any]]:
    """What the instance waits on now, one entry each: ``kind`` (event, child, message,
    timer, queue, burst) and what to show of it."""
    found: list[dict[str, Any]] = []
    for sub in info["subscriptions"]:
        match = sub["match"] if isinstance(sub["match"], dict) else {}
        if sub["event_type"] == CHILD_EVENT_TYPE and "child_id" in match:
            found.append({"kind": "child", "child_id": match["child_id"], "step": sub["step_id"]})
        else:
            found.append(
                {
                    "kind": "event",
                    "event_type": sub["event_type"],
                    "match": sub["match"],
                    "step": sub["step_id"],
                    "timeout_at": sub["timeout_at"],
                }
            )
    for wait in info["message_waits"]:
        topic, step, timeout_at = wait["topic"], wait["step_id"], wait["timeout_at"]
        found.append({"kind": "message", "topic": topic, "step": step, "timeout_at": timeout_at})
    for timer in info["timers"]:
        found.append({"kind": "timer", "step": timer["step_id"], "due_at": timer["due_at"]})
    queue = info.get("queue")
    if queue is not None:
        found.append({"kind": "queue", "queue": queue, "text": why.queue_text(queue, info["db_now"])})
    return found
