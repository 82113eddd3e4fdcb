"""``wait_for_approval``: a person's yes or no, waited for durably (hours or days, across
restarts), on the requests mechanism a workflow already has.

The workflow publishes what waits for a decision (``Client.get_value(id, "approvals")``,
the console's values) and takes decisions from its ``approval`` mailbox, each a request a
person sends and gets an answer to::

    kenning request INSTANCE approval '{"call_id": "c-1", "approved": true}'
    kenning request INSTANCE approval '{"call_id": "c-1", "approved": false, "reason": "too much"}'
    # or: await client.request(instance_id, "approval", {"call_id": "c-1", "approved": True})

Every step here is an ordinary recorded one (``publish_value``, ``receive``, ``reply``), so
a decision is taken once and a replay gets the same one. A decision for a call nothing
waits on, or one that is not ``{"call_id": str, "approved": bool, "reason"?: str}``, is
refused (``RequestRejectedError`` for the sender, exit 1 at the CLI) and changes nothing.
Adapters (``kenning.ai``) ask here, so the next adapter finds approvals in the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kenning.context import WorkflowContext
from kenning.messages import publish_value, receive

APPROVAL_TOPIC = "approval"
APPROVALS_VALUE_KEY = "approvals"


@dataclass(frozen=True)
class ApprovalDecision:
    """What a person decided about one call."""

    call_id: str
    approved: bool
    reason: str | None = None


async def wait_for_approval(
    ctx: WorkflowContext, call_id: str, details: Any = None, *, topic: str = APPROVAL_TOPIC
) -> ApprovalDecision:
    """Wait, without holding a worker, until a person approves or denies ``call_id``
    (``details``, any JSON, say what is asked: published for the person to read)."""
    decisions = await wait_for_approvals(ctx, {call_id: details}, topic=topic)
    return decisions[call_id]


async def wait_for_approvals(
    ctx: WorkflowContext, pending: Mapping[str, Any], *, topic: str = APPROVAL_TOPIC
) -> dict[str, ApprovalDecision]:
    """Wait until every call of ``pending`` (call id -> details) is decided, in whatever
    order the decisions come; returns them by call id."""
    waiting = dict(pending)
    decided: dict[str, ApprovalDecision] = {}
    await _publish(ctx, waiting, decided)
    while waiting:
        message = await receive(ctx, topic)
        decision, problem = _parse(message.data, waiting)
        if decision is None:
            await message.reply_error(ctx, problem)
            continue
        del waiting[decision.call_id]
        decided[decision.call_id] = decision
        await message.reply(ctx, {"call_id": decision.call_id, "approved": decision.approved})
        await _publish(ctx, waiting, decided)
    return decided


def _parse(data: Any, waiting: Mapping[str, Any]) -> tuple[ApprovalDecision | None, str]:
    """The decision a message carries, or why it is refused."""
    if not isinstance(data, dict) or not isinstance(data.get("call_id"), str):
        return None, 'an approval is {"call_id": "...", "approved": true|false, "reason": "..."}'
    call_id = data["call_id"]
    if call_id not in waiting:
        open_ids = ", ".join(sorted(waiting)) or "none"
        return None, f"no approval is waiting for call {call_id!r} (waiting: {open_ids})"
    approved, reason = data.get("approved"), data.get("reason")
    if not isinstance(approved, bool):
        return None, f"call {call_id!r}: 'approved' must be true or false, got {approved!r}"
    if reason is not None and not isinstance(reason, str):
        return None, f"call {call_id!r}: 'reason' must be a string"
    return ApprovalDecision(call_id, approved, reason), ""


async def _publish(ctx: WorkflowContext, waiting: Mapping[str, Any], decided: Mapping[str, ApprovalDecision]) -> None:
    """What waits and what was decided, for a person (and a console) to read."""
    await publish_value(
        ctx,
        APPROVALS_VALUE_KEY,
        {
            "pending": [{"call_id": call_id, "details": details} for call_id, details in waiting.items()],
            "decided": [{"call_id": d.call_id, "approved": d.approved, "reason": d.reason} for d in decided.values()],
        },
    )


__all__ = ["APPROVALS_VALUE_KEY", "APPROVAL_TOPIC", "ApprovalDecision", "wait_for_approval", "wait_for_approvals"]
