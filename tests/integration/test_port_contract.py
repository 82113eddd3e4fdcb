"""Fidelity, proven (issue 27, item 2): every scenario runs on ``kenning.testing``'s
in-memory backend and on PostgreSQL (the real worker and scheduler, time skipped by
moving stored times), and the two must agree on every instance: status, stored result,
error (type and message), and history (kind, step id, step name of each step, in order).
A divergence fails with both sides shown.

Among the cases are the in-memory port's two old defects: an event outside a wait's
``match`` was delivered, and an event timeout could not be driven
(``test_a_planted_divergence_fails`` plants the first again and watches it fail).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from kenning import RequestError
from kenning.examples import orders
from kenning.testing import InstanceState, WorkflowEnvironment
from kenning.testing.memorystate import MemoryEvent, MemoryInstance
from tests.apps import contract
from tests.apps import requests as request_apps
from tests.logguard import expect_log

Scenario = Callable[[WorkflowEnvironment], Awaitable[None]]
ORDER = {"order_id": "o-1", "items": [{"sku": "book", "qty": 1}], "amount": 42}
# how many runs a chain that never waits makes before its deadline is the machine's speed
# (PostgreSQL's) or the environment's cap (in memory): its run number is not compared
ENDLESS = "endless"


def order(order_id: str) -> dict[str, Any]:
    return {**ORDER, "order_id": order_id}


# ---------------------------------------------------------------- the scenarios


async def order_saga_paths(env: WorkflowEnvironment) -> None:
    """The README's saga: paid, declined, timed out, cancelled; an event for another order."""
    paid = await env.start(orders.order_saga, instance_id="paid", order=order("o-1"))
    await env.send_event("payment.completed", {"order_id": "o-9", "status": "approved"})  # not o-1's
    await env.send_event("payment.completed", {"order_id": "o-1", "status": "approved"})
    await env.sleep(timedelta(minutes=11))
    await env.start(orders.order_saga, instance_id="declined", order=order("o-2"))
    await env.send_event("payment.completed", {"order_id": "o-2", "status": "declined"})
    await env.start(orders.order_saga, instance_id="timed-out", order=order("o-3"))
    await env.sleep(timedelta(minutes=6))
    await env.start(orders.order_saga, instance_id="cancelled", order=order("o-4"))
    await env.cancel("cancelled")
    await paid.state()


async def match_and_since(env: WorkflowEnvironment) -> None:
    await env.send_event("paid", {"order_id": "early", "amount": 1})
    await env.start(contract.waits, instance_id="since-early", order_id="early", timeout=60, since=30)
    await env.start(contract.waits, instance_id="plain-early", order_id="early", timeout=60)
    await env.start(contract.waits, instance_id="other", order_id="mine", timeout=60)
    await env.send_event("paid", {"order_id": "not-mine", "amount": 2})
    await env.sleep(10)
    await env.send_event("paid", {"order_id": "stale", "amount": 3})
    await env.sleep(31)
    await env.start(contract.waits, instance_id="since-stale", order_id="stale", timeout=60, since=30)
    await env.sleep(timedelta(minutes=2))  # every wait left times out


async def timers(env: WorkflowEnvironment) -> None:
    await env.start(contract.timers, instance_id="timers")
    await env.sleep(9)
    await env.sleep(timedelta(hours=2))


async def retries(env: WorkflowEnvironment) -> None:
    await env.start(contract.retries, instance_id="retried", failures=3)
    await env.start(contract.gives_up, instance_id="gave-up")
    await env.start(contract.deadline, instance_id="deadline")
    await env.sleep(timedelta(minutes=10))


async def children(env: WorkflowEnvironment) -> None:
    await env.start(contract.parent, instance_id="parent", seconds=7200)
    await env.start(contract.parent, instance_id="parent-of-failing", seconds=5, fail=True)
    await env.sleep(timedelta(hours=3))


async def messages(env: WorkflowEnvironment) -> None:
    await env.start(contract.receiver, instance_id="receiver")
    await env.start(contract.listener, instance_id="listener")
    await env.start(contract.announcer, instance_id="announcer", to="receiver")
    await env.sleep(timedelta(minutes=2))  # the receiver's second receive times out


async def events(env: WorkflowEnvironment) -> None:
    await env.send_event("contract.started_by_event", {"order_id": "abcd"}, event_id="e-1")
    await env.send_event("contract.started_by_event", {"order_id": "abcd"}, event_id="e-1")  # a duplicate
    await env.start(contract.any_event, instance_id="one")
    await env.start(contract.any_event, instance_id="two")
    await env.send_event("ping", "for two", instance_id="two")
    await env.sleep(timedelta(minutes=2))


async def cancellations(env: WorkflowEnvironment) -> None:
    await env.start(contract.cancellable, instance_id="cancelled-waiting")
    await env.cancel("cancelled-waiting")
    await env.start(contract.parent, instance_id="cancelled-parent", seconds=600)
    await env.cancel("cancelled-parent")
    await env.sleep(timedelta(minutes=20))


async def workflow_timeouts(env: WorkflowEnvironment) -> None:
    """The workflow's 600 s and a start's own 60 s, and a child's own or its workflow's: each
    fires once, compensated, at its time; a parent hears its child's as a failed child."""
    await env.start(contract.bounded, instance_id="bounded")
    await env.start(contract.bounded.options(timeout=60), instance_id="bounded-60")
    await env.start(contract.bounds_a_child, instance_id="parent-600")
    await env.start(contract.bounds_a_child, instance_id="parent-30", seconds=30)
    await env.sleep(120)
    assert (await env.backend.state("bounded")).status == "waiting_for_event"
    assert (await env.backend.state("parent-30")).status == "completed"
    assert (await env.backend.state("parent-600")).status == "waiting_for_event"
    assert (await env.backend.state("bounded-60")).status == "failed"
    await env.sleep(timedelta(minutes=10))


async def endless_chain(env: WorkflowEnvironment) -> None:
    """A chain that never waits, under a workflow timeout: on PostgreSQL it runs until the
    deadline fires and ends failed with ``WorkflowTimeoutError``; the in-memory backend once
    gave up with a ``RuntimeError`` (issue 33, item 6)."""
    await env.start(contract.endless.options(timeout=2), instance_id=ENDLESS)


async def heartbeats(env: WorkflowEnvironment) -> None:
    """A hung attempt stopped by its heartbeat timeout; the retry resumes from its checkpoint."""
    await env.start(contract.heartbeats, instance_id="resumed", rows=4)


async def requests(env: WorkflowEnvironment) -> None:
    """Requests with a reply: answered, refused, retried, unanswered, a second reply."""
    approver = await env.start(request_apps.approver, instance_id="approver", count=2)
    assert await approver.request("approve", {"amount": 3}, request_id="r-1") == {"approved": True, "amount": 3}
    assert await approver.request("approve", {"amount": 4}, request_id="r-1") == {"approved": True, "amount": 3}
    for instance_id, workflow in (("approver", None), ("ignorer", request_apps.ignorer)):
        if workflow is not None:
            await env.start(workflow, instance_id=instance_id)
        try:
            await env.request(instance_id, "approve", {"amount": 5000}, request_id=f"r-{instance_id}", timeout=60)
        except RequestError:
            pass  # refused, not answered: the states are compared
    await env.start(request_apps.twice, instance_id="twice")
    assert await env.request("twice", "approve", None, request_id="r-twice", timeout=60) == "first"
    slow = await env.start(request_apps.slow, instance_id="slow", seconds=600)
    try:
        await slow.request("approve", 1, request_id="r-slow", timeout=60)
    except RequestError:
        pass
    await env.sleep(timedelta(minutes=11))


async def published(env: WorkflowEnvironment) -> None:
    await env.start(contract.published, instance_id="published-1", customer="c-1")
    await env.start(contract.published, instance_id="published-2", customer="c-2", fail=True)
    await env.sleep(30)  # both wait in their timer: the first values are published
    await env.start(contract.published, instance_id="published-3", customer="c-3")
    await env.sleep(timedelta(minutes=2))


async def continue_as_new(env: WorkflowEnvironment) -> None:
    """A chain of three runs: messages sent before it, while it waits, between its runs."""
    await env.start(contract.chain, instance_id="chain", per_run=2, runs=3)
    for n in range(1, 5):
        await env.send_message("chain", "numbers", n, message_id=f"m{n}")
    await env.sleep(1)
    for n in range(5, 7):
        await env.send_message("chain", "numbers", n, message_id=f"m{n}")


async def long_running_together(env: WorkflowEnvironment) -> None:
    """Requests answered across a continue_as_new chain; published values and the search
    attribute of run 1 still read after run 3."""
    await env.start(contract.entity, instance_id="entity", owner="ann")
    for run in (1, 2, 3):
        reply = await env.request("entity", "bump", None, request_id=f"b{run}", timeout=60)
        assert reply == {"run": run, "bumps": run}
    assert await env.request("entity", "bump", None, request_id="b1") == {"run": 1, "bumps": 1}  # a retry
    assert await env.get_value("entity", "owner") == "ann"
    status = await env.get_status("entity")
    assert status is not None and (status.text, status.progress) == ("run 3", 1.0)
    assert [h.instance_id for h in await env.instances(where={"owner": "ann"})] == ["entity"]
    state = await env.backend.state("entity")
    assert (state.status, state.run, state.result) == ("completed", 3, {"result": 3})


async def start_attributes(env: WorkflowEnvironment) -> None:
    """Search attributes set by a start and by a child's start: found and read at once."""
    await env.start(
        contract.tagged.options(search_attributes={"tenant": "acme", "tier": 2}), instance_id="acme", children=1
    )
    assert [h.instance_id for h in await env.instances(where={"tenant": "acme"})] == ["acme"]
    assert len(await env.instances(where={"tenant": "acme-0", "tier": 0})) == 1  # the child's
    assert await env.get_value("acme", "tier") == 2
    await env.sleep(61)


async def streams(env: WorkflowEnvironment) -> None:
    """Entries from workflow code and a retried activity, a closed stream and an open
    one, read the same way on both backends before and after the instance's end."""
    handle = await env.start(contract.streamer, instance_id="streamer", words=["one", "two"])
    await env.sleep(10)  # the activity's retry ran; the instance waits in its timer
    talk = [(e.offset, e.attempt, e.step, e.value) async for e in handle.read_stream("talk")]
    assert talk == [
        (0, 0, None, "hello"),
        (1, 0, None, "side closed"),
        (2, 1, "speak:1", "one"),
        (3, 2, "speak:1", "one"),
        (4, 2, "speak:1", "two"),
    ]
    assert [e.offset async for e in handle.read_stream("talk", offset=3)] == [3, 4]
    assert (await handle.stream_closed("side"), await handle.stream_closed("open")) == (True, False)
    assert [e.data["value"] for e in await env.outbox()] == ["one", "one", "two"]  # publish=True
    await env.sleep(60)
    assert await handle.stream_closed("open")  # the end closed it


async def stream_refused_after_a_step(env: WorkflowEnvironment) -> None:
    """A step's record held back for the next commit survives the write it rode with
    being refused (a closed stream): the history keeps it before the refusal."""
    handle = await env.start(contract.refused_after_a_step, instance_id="refused")
    state = await handle.state()
    assert (state.status, state.result) == ("completed", {"result": 3}), state


SCENARIOS: dict[str, Scenario] = {
    "order_saga_paths": order_saga_paths,
    "match_and_since": match_and_since,
    "timers": timers,
    "retries": retries,
    "children": children,
    "messages": messages,
    "events": events,
    "cancellations": cancellations,
    "workflow_timeouts": workflow_timeouts,
    "endless_chain": endless_chain,
    "heartbeats": heartbeats,
    "requests": requests,
    "published": published,
    "continue_as_new": continue_as_new,
    "long_running_together": long_running_together,
    "start_attributes": start_attributes,
    "streams": streams,
    "stream_refused_after_a_step": stream_refused_after_a_step,
}


# ---------------------------------------------------------------- running and comparing


def error_of(error: dict[str, Any] | None) -> Any:
    """What must agree of a stored error: its type and message, and the workflow's error
    a failed saga keeps inside it."""
    if error is None:
        return None
    kept = {k: error.get(k) for k in ("type", "message", "reason")}
    if isinstance(error.get("workflow_error"), dict):
        kept["workflow_error"] = error_of(error["workflow_error"])
    return kept


def comparable(state: InstanceState, ids: dict[str, str]) -> dict[str, Any]:
    """An instance as both backends must agree on it (generated ids named by their order)."""

    def named(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for real, name in ids.items():
            text = text.replace(real, name)
        # a moment (a workflow timeout's deadline): PostgreSQL moves stored times back where
        # the in-memory clock moves forward, so the two name different instants
        return re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "<time>", text)

    return {
        "workflow": state.workflow_name,
        "status": state.status,
        "result": state.result,
        "error": None if state.error is None else {k: named(v) for k, v in error_of(state.error).items()},
        "history": [(e.kind, named(e.step_id), e.step_name) for e in state.history],
        "values": state.values,  # publish_value, set_status
        "search_attributes": state.search_attributes,
        "run": None if state.instance_id == ENDLESS else state.run,
        "streams": {k: [(e.offset, e.attempt, e.step, e.value) for e in v] for k, v in state.streams.items()},
        "closed_streams": sorted(state.closed_streams),
    }


async def outcome(env: WorkflowEnvironment, scenario: Scenario) -> dict[str, dict[str, Any]]:
    """Every instance after the scenario, keyed by its id (generated ids: by workflow and order)."""
    contract.ATTEMPTS.clear()  # activities count attempts by instance id: each run its own
    await scenario(env)
    await env.settle()
    states = [await env.backend.state(i) for i in await env.backend.instance_ids()]
    states.sort(key=lambda s: (s.instance_id.startswith(s.workflow_name + "-"), s.workflow_name, s.instance_id))
    ids: dict[str, str] = {}
    for state in states:
        if state.instance_id.startswith(state.workflow_name + "-"):  # generated: the child's, the event's
            ids[state.instance_id] = f"{state.workflow_name}#{len(ids) + 1}"
    return {ids.get(s.instance_id, s.instance_id): comparable(s, ids) for s in states}


def divergences(memory: dict[str, dict[str, Any]], postgres: dict[str, dict[str, Any]]) -> list[str]:
    found = [f"{i}: only in {'memory' if i in memory else 'postgresql'}" for i in sorted(set(memory) ^ set(postgres))]
    for instance_id in sorted(set(memory) & set(postgres)):
        for key, value in memory[instance_id].items():
            theirs = postgres[instance_id][key]
            if value != theirs:
                found.append(f"{instance_id} {key}:\n  memory:     {value!r}\n  postgresql: {theirs!r}")
    return found


async def run_both(scenario: Scenario, database_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    async with WorkflowEnvironment(contract.app) as env:
        memory = await outcome(env, scenario)
    async with WorkflowEnvironment(contract.app, database_url=database_url, migrate=False) as env:
        postgres = await outcome(env, scenario)
    return memory, postgres


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_memory_and_postgresql_agree(name: str, database_url: str) -> None:
    expect_log("instance.failed")  # the scenarios' failing paths
    memory, postgres = await run_both(SCENARIOS[name], database_url)
    assert memory, "the scenario started nothing"
    problems = divergences(memory, postgres)
    assert not problems, f"{name}: the in-memory backend diverges from PostgreSQL:\n" + "\n".join(problems)


async def test_a_planted_divergence_fails(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old defect planted again (delivery ignoring ``match``): the contract catches it."""
    expect_log("instance.failed")
    _, postgres = await run_both(match_and_since, database_url)
    takes = MemoryInstance.takes

    def ignoring_match(self: MemoryInstance, event: MemoryEvent) -> bool:
        waiting = self.waiting_for
        if waiting is not None and getattr(waiting, "match", None) is not None:
            self.waiting_for = type(waiting)(**{**vars(waiting), "match": None})
            try:
                return takes(self, event)
            finally:
                self.waiting_for = waiting
        return takes(self, event)

    monkeypatch.setattr(MemoryInstance, "takes", ignoring_match)
    async with WorkflowEnvironment(contract.app) as env:
        planted = await outcome(env, match_and_since)
    problems = divergences(planted, postgres)
    assert any(p.startswith("other status") for p in problems), problems


@pytest.mark.parametrize("workflow_env", ["postgresql"], indirect=True)
async def test_the_pytest_fixture_runs_on_postgresql(workflow_env: WorkflowEnvironment) -> None:
    assert workflow_env.mode == "postgresql"
    handle = await workflow_env.start(contract.timers)
    assert await handle.result() == ["charged 5"]


async def test_a_continue_as_new_chain_ends_in_its_last_run_on_both_backends(database_url: str) -> None:
    """The chain scenario's outcome itself, not only the agreement: three runs, every
    message counted once (1 + ... + 6), the last run's history alone (its two receives)."""
    memory, postgres = await run_both(continue_as_new, database_url)
    for side in (memory, postgres):
        chain = side["chain"]
        assert chain["status"] == "completed", chain
        assert chain["result"] == {"result": {"total": 21, "run": 3}}
        assert chain["run"] == 3
        assert [kind for kind, _, _ in chain["history"]] == ["MessageReceived", "MessageReceived"]


async def test_env_result_is_the_last_runs_on_postgresql(database_url: str) -> None:
    async with WorkflowEnvironment(contract.app, database_url=database_url, migrate=False) as env:
        chain = await env.start(contract.chain, per_run=1, runs=4)
        for n in range(1, 5):
            await chain.send_message("numbers", n)
        assert await chain.result() == {"total": 10, "run": 4}
        assert (await chain.state()).run == 4


async def test_a_chain_that_never_waits_ends_by_its_workflow_timeout_on_both_backends(database_url: str) -> None:
    """The outcome itself: failed with ``WorkflowTimeoutError``, in memory as on PostgreSQL."""
    expect_log("instance.failed")
    memory, postgres = await run_both(endless_chain, database_url)
    for side in (memory, postgres):
        endless = side[ENDLESS]
        assert endless["status"] == "failed", endless
        assert endless["error"]["type"].endswith("WorkflowTimeoutError"), endless
