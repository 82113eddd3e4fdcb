"""The support agent example (issue 34, item 3) in memory, on its fake model: a refund
waits for a person and runs once approved; denied, the agent answers without it; a
question without a refund asks nobody."""

from __future__ import annotations

from kenning.examples import agent as example
from kenning.testing import WorkflowEnvironment


async def test_an_approved_refund_runs_and_a_denied_one_does_not() -> None:
    async with WorkflowEnvironment(example.app) as env:
        approved = await env.start(example.support, question="Please refund 30 on order o-1")
        denied = await env.start(example.support, question="refund 5 on o-2")
        await env.settle()
        assert await approved.status() == "waiting_for_message"
        assert (await approved.get_value("approvals"))["pending"] == [
            {"call_id": "refund-1", "details": {"tool": "refund", "args": {"order_id": "o-1", "amount": 30}}}
        ]
        assert await approved.request("approval", {"call_id": "refund-1", "approved": True}) == {
            "call_id": "refund-1",
            "approved": True,
        }
        assert await approved.result() == "Order o-1 is delivered. Refund: 30 refunded on o-1."
        await denied.request("approval", {"call_id": "refund-1", "approved": False, "reason": "over the limit"})
        assert await denied.result() == "Order o-2 is in transit. Refund: over the limit."
        plain = await env.start(example.support, question="Where is o-2?")
        assert await plain.result() == "Order o-2 is in transit."
