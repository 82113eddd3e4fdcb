"""The python examples of docs/workflows.md's sections on long-running workflows (issue
29) run as written: each block is executed as a module, then its workflow runs on the
in-memory port. No database."""

from __future__ import annotations

import re
import sys
import time
import types
from pathlib import Path

from kenning import App
from kenning.engine.outcomes import RunOutcome
from kenning.testing.memoryport import run_once, run_until_rest
from kenning.testing.memorystate import MemoryInstance
from tests.logguard import expect_log

DOC = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


def example(section: str) -> types.ModuleType:
    """The first python block under ``## section``, imported as a module of its own."""
    text = DOC.read_text()
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    body = re.search(r"^```python\n(.*?)^```", part, flags=re.S | re.M)
    assert body is not None, f"no python example under {section!r}"
    name = "docs_example_" + re.sub(r"\W", "_", section.lower())
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses and type hints look their module up
    exec(compile(body.group(1), f"{DOC}:{section}", "exec"), module.__dict__)
    return module


async def test_the_heartbeat_example_imports_every_row() -> None:
    example("Activity heartbeats")
    instance = MemoryInstance(id="doc-1", workflow_name="nightly_import", input={"rows": ["a", "b", "c"]})
    assert await run_once(App(), instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": 3}


async def test_the_timeout_example_fails_at_its_deadline() -> None:
    module = example("Workflow timeouts")
    assert module.pay_or_release.timeout == 3 * 24 * 3600
    instance = MemoryInstance(id="doc-2", workflow_name="pay_or_release", input={"order_id": "o-1"})
    instance.deadline_at, instance.cancel_requested = time.time() - 1, True  # as the scheduler leaves it
    expect_log("instance.timed_out")
    assert await run_once(App(), instance) is RunOutcome.FAILED
    assert instance.error is not None and instance.error["type"] == "kenning.errors.WorkflowTimeoutError"


async def test_the_request_example_replies_and_refuses() -> None:
    from kenning import RequestRejectedError
    from kenning.testing import WorkflowEnvironment

    module = example("Requests with a reply")
    async with WorkflowEnvironment() as env:
        handle = await env.start(module.budget, total=100)
        assert await handle.request("spend", {"amount": 30}, timeout=10) == {"left": 70}
        try:
            await handle.request("spend", {"amount": 80}, timeout=10)
        except RequestRejectedError as error:
            assert error.reason == "only 70 left"
        else:
            raise AssertionError("a request over the budget was not refused")
        assert await handle.request("spend", {"amount": 70}, request_id="last") == {"left": 0}
        assert await handle.result() == 100
        assert await handle.request("spend", None, request_id="last") == {"left": 0}  # a retry, after the end


async def test_the_published_state_example_publishes_and_is_found() -> None:
    from kenning.testing import WorkflowEnvironment

    module = example("Published state and search")
    assert module.order_checkout.search_attributes == {"customer", "region"}
    async with WorkflowEnvironment(App()) as env:
        for order_id, customer, region in [("o-1", "c-1", "eu"), ("o-2", "c-1", "us"), ("o-3", "c-2", "eu")]:
            arguments = {"order_id": order_id, "customer": customer, "region": region}
            await env.start(module.order_checkout, instance_id=order_id, **arguments)
        assert await env.get_value("o-1", "payment_link") == "https://pay.example/o-1"
        status = await env.get_status("o-1")
        assert status is not None and (status.text, status.progress) == ("awaiting payment", 0.4)
        assert [h.instance_id for h in await env.instances(where={"customer": "c-1", "region": "eu"})] == ["o-1"]
        await env.send_event("payment.completed", {"order_id": "o-1"})
        assert await env.handle("o-1").result() == "paid"
        done = await env.get_status("o-1")
        assert done is not None and done.text == "paid"


async def test_the_continue_as_new_example_carries_the_balance_across_runs() -> None:
    example("Continue-as-new")
    instance = MemoryInstance(id="doc-3", workflow_name="ledger", input={"account": "a-1", "per_run": 2})
    for n, amount in enumerate([5, 7, 11, 13, 17, "close"]):
        instance.send_message("entries", amount, message_id=f"e{n}")
    outcomes = await run_until_rest(App(), instance)
    assert outcomes == [RunOutcome.CONTINUED, RunOutcome.CONTINUED, RunOutcome.COMPLETED]
    assert instance.result == {"result": 53}
    assert instance.run == 3 and [r["input"].get("balance", 0) for r in instance.runs] == [0, 12]


async def test_the_flow_control_example_declares_a_debounce_and_a_batch() -> None:
    module = example("Flow control per key")
    debounce = module.index_document.debounce
    assert (debounce.key, debounce.period, debounce.max_wait) == ("document_id", 5, 60)
    assert debounce.key_of({"document_id": "d-1", "revision": 3}) == "d-1"
    batch = module.store_readings.batch
    assert (batch.max_size, batch.max_wait, batch.key_of({"tenant": "t-1"})) == (100, 2, "t-1")
    events = [{"tenant": "t-1", "n": n} for n in range(3)]
    instance = MemoryInstance(id="doc-flow", workflow_name="sensor.reading", input={"events": events})
    assert await run_once(App(), instance) is RunOutcome.COMPLETED
    assert instance.result == {"result": 3}
