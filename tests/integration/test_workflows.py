"""Behaviour of the SDK and replay engine, with an in-process worker on real PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from kenning import Client, NonDeterminismError, WorkflowFailedError
from kenning.client import InvalidInputError
from kenning.db import Database
from tests.apps import core
from tests.logguard import LogGuard, expect_log
from tests.support import eventually, executions, running_worker

# Back-offs of 0.2 s (pause_once) exceed this, so they release the instance for a replay.
INLINE = {"inline_retry_seconds": 0.1}


def history(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> list[tuple[str, str]]:
    rows = sql.execute(
        "SELECT step_id, kind FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()
    return [(str(a), str(b)) for a, b in rows]


@pytest.mark.smoke
async def test_three_steps_complete_with_each_step_recorded_once(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.three_steps, value=4)
        assert await client.result(started.instance_id, timeout=10) == (4 + 1) * 2 - 3
    assert history(sql, started.instance_id) == [
        ("step_one:1", "ActivityCompleted"),
        ("step_two:1", "ActivityCompleted"),
        ("step_three:1", "ActivityCompleted"),
    ]
    status = await client.status(started.instance_id)
    assert status.status == "completed" and status.lease_owner is None
    counts = executions(side_channel)
    assert counts == {f"{s} {started.instance_id}": 1 for s in ("step_one", "step_two", "step_three")}


async def test_start_refuses_ids_and_input_postgresql_cannot_hold(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A NUL or an over-long id is the caller's mistake, said at once: not a failed batch
    of starts (shared with other callers) or an id no ingress path could name."""
    async with Client(database=database) as client:
        for bad in ("a\x00b", "x" * 1025):
            with pytest.raises(InvalidInputError, match="at most 1024 characters with no NUL"):
                await client.start(core.three_steps, instance_id=bad, value=1)
            with pytest.raises(InvalidInputError, match="at most 1024 characters with no NUL"):
                await client.start(core.three_steps, idempotency_key=bad, value=1)
        with pytest.raises(InvalidInputError, match="cannot be stored: contains a NUL character"):
            await client.start("free.form", payload="a\x00b")
        assert (await client.start(core.three_steps, instance_id="y" * 1024, value=1)).created
    assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (1,)


async def test_start_does_not_run_code_and_is_idempotent(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=database) as client:
        first = await client.start(core.three_steps, instance_id="order-1", value=1)
        again = await client.start(core.three_steps, instance_id="order-1", value=99)
        keyed = await client.start(core.three_steps, idempotency_key="k-1", value=1)
        keyed_again = await client.start(core.three_steps, idempotency_key="k-1", value=2)
        assert first == again.__class__("order-1", True) and again.created is False
        assert keyed.created and keyed_again == keyed.__class__(keyed.instance_id, False)
        assert (await client.status("order-1")).status == "pending"
        assert executions(side_channel) == {}
        with pytest.raises(TypeError, match="invalid input for workflow 'three_steps'"):
            await client.start(core.three_steps, wrong=1)  # type: ignore[call-overload]  # mypy refuses it too
        listed = await client.list(workflow="three_steps")
        assert {r.id for r in listed} == {"order-1", keyed.instance_id}
        with pytest.raises(TimeoutError):
            await client.result("order-1", timeout=0.1)
    assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (2,)


async def test_pydantic_enum_and_list_of_models_survive_replay(database: Database, side_channel: str) -> None:
    order = core.Order(
        order_id="o-1", items=[core.Item(sku="ab", qty=1), core.Item(sku="cd", qty=2)], color=core.Color.RED
    )
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        started = await client.start(core.typed, order=order)
        result = await client.result(started.instance_id, timeout=10)
    assert result == {"skus": ["AB", "CD"], "qty": 30, "color": "blue"}
    counts = executions(side_channel)
    # price and choose ran once although the workflow body ran twice (replay after the back-off)
    assert counts[f"price {started.instance_id}"] == 1
    assert counts[f"choose {started.instance_id}"] == 1
    assert counts[f"pause_once {started.instance_id}"] == 2


async def test_single_model_parameter_takes_the_whole_input(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        # The CloudEvent-data shape: fields of the model at the top level of the input.
        started = await client.start("typed", order_id="o-2", items=[{"sku": "x", "qty": 1}], color="blue")
        assert (await client.result(started.instance_id, timeout=10))["color"] == "red"


async def test_retries_are_counted_and_then_succeed(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str, log_guard: LogGuard
) -> None:
    with log_guard.capture() as logs:
        async with Client(database=database) as client, running_worker(database, core.app):
            started = await client.start(core.retrying, failures=2)
            assert await client.result(started.instance_id, timeout=10) == "ok"
    assert executions(side_channel)[f"flaky {started.instance_id}"] == 3
    assert [e["attempt"] for e in logs if e["event"] == "activity.retry"] == [1, 2]
    # the attempt counters are cleared once the step succeeded
    assert sql.execute("SELECT attempts FROM kenning_instances WHERE id = %s", (started.instance_id,)).fetchone() == (
        {},
    )


async def test_failures_keep_their_type_on_replay(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        started = await client.start(core.catches_failure)
        result = await client.result(started.instance_id, timeout=10)
    assert result == ["RetryExhaustedError<-ValueError", "TerminalError:card declined"]
    counts = executions(side_channel)
    assert counts[f"always_fails {started.instance_id}"] == 3  # FAST allows 3 attempts
    assert counts[f"terminal {started.instance_id}"] == 1  # terminal errors are never retried
    assert counts[f"pause_once {started.instance_id}"] == 2  # so the failures were replayed once


async def test_long_backoff_releases_the_worker_and_attempts_survive(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        started = await client.start(core.durable_retry)

        def released() -> bool:
            row = sql.execute(
                "SELECT status, lease_token, attempts FROM kenning_instances WHERE id = %s", (started.instance_id,)
            ).fetchone()
            assert row is not None
            attempts: dict[str, dict[str, object]] = row[2]  # type: ignore[assignment]
            return row[0] == "pending" and row[1] is None and attempts.get("slow_retry:1", {}).get("attempts") == 1

        await eventually(released, timeout=5, message="instance released during its back-off")
        assert await client.result(started.instance_id, timeout=10) == 3
    assert executions(side_channel)[f"slow_retry {started.instance_id}"] == 3


@pytest.mark.smoke
async def test_saga_compensates_in_reverse_with_positional_and_keyword_arguments(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    expect_log("instance.failed", workflow="saga")
    async with Client(database=database) as client, running_worker(database, core.app):
        ok = await client.start(core.saga, amount=7, fail=False)
        bad = await client.start(core.saga, amount=9, fail=True)
        assert await client.result(ok.instance_id, timeout=10) == "shipped"
        with pytest.raises(WorkflowFailedError, match="no courier"):
            await client.result(bad.instance_id, timeout=10)
    counts = executions(side_channel)
    assert not any(k.startswith(("refund", "release")) and ok.instance_id in k for k in counts)
    steps = [s for s, kind in history(sql, bad.instance_id) if kind == "CompensationExecuted"]
    assert steps == ["compensation:comp:2", "compensation:on_failure:reserve:1"]  # newest first
    assert counts[f"refund:9 {bad.instance_id}"] == 1
    assert counts[f"release_stock:sku1:2:r-sku1 {bad.instance_id}"] == 1
    assert ("failed", bad.instance_id) in core.hooks.calls


async def test_cancel_running_instance_takes_effect_at_next_step(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.cancellable, gate_name="g1")
        await eventually(lambda: executions(side_channel)[f"gate {started.instance_id}"] == 1)
        assert await client.cancel(started.instance_id) is True
        core.GATES["g1"].set()
        with pytest.raises(WorkflowFailedError, match="cancelled"):
            await client.result(started.instance_id, timeout=10)
    counts = executions(side_channel)
    assert counts[f"charge {started.instance_id}"] == 0  # the step after the boundary never ran
    assert counts[f"release_stock:sku9:1:r-sku9 {started.instance_id}"] == 1
    assert ("cancelled", started.instance_id) in core.hooks.calls


async def test_cancel_before_any_worker_runs_nothing(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client:
        started = await client.start(core.three_steps, value=1)
        assert await client.cancel(started.instance_id) is True
        async with running_worker(database, core.app):
            with pytest.raises(WorkflowFailedError, match="cancelled"):
                await client.result(started.instance_id, timeout=10)
        assert await client.cancel(started.instance_id) is False  # already finished
    assert executions(side_channel) == {}


async def test_concurrent_steps_with_explicit_ids_replay_in_any_order(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        started = await client.start(core.fan_out)
        assert await client.result(started.instance_id, timeout=10) == [0, 1, 4, 9, 16]
    counts = executions(side_channel)
    assert all(counts[f"square:{n} {started.instance_id}"] == 1 for n in range(5))


async def test_changed_step_is_reported_as_non_determinism(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    expect_log("instance.non_deterministic", workflow="changes_shape")
    core.VARIANT["name"] = "a"
    try:
        async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
            started = await client.start(core.changes_shape)
            # pause_once released the instance: change the code before it is replayed
            await eventually(lambda: executions(side_channel)[f"pause_once {started.instance_id}"] == 1)
            core.VARIANT["name"] = "b"
            with pytest.raises(WorkflowFailedError) as failure:
                await client.result(started.instance_id, timeout=10)
    finally:
        core.VARIANT["name"] = "a"
    error = failure.value.error
    assert error is not None and error["type"] == f"{NonDeterminismError.__module__}.NonDeterminismError"
    assert "variant_a:1" in str(error["message"]) and "variant_b:1" in str(error["message"])
    # no compensation and no new step ran on the diverging path
    assert [s for s, _ in history(sql, started.instance_id)] == ["variant_a:1"]


async def test_hooks_fire_on_the_resume_path(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, **INLINE):
        started = await client.start(core.fan_out)
        await client.result(started.instance_id, timeout=10)
    mine = [c for c, i in core.hooks.calls if i == started.instance_id]
    assert mine.count("start") == 1
    assert mine[-1] == "complete"  # completed on the second run, after the replay
    assert "activity:square-0:hit" in mine and "activity:square-0:run" in mine


async def test_polling_only_worker_still_runs_everything(database: Database, side_channel: str) -> None:
    async with Client(database=database) as client, running_worker(database, core.app, listen=False):
        ids = [(await client.start(core.three_steps, value=n)).instance_id for n in range(5)]
        results = await asyncio.gather(*(client.result(i, timeout=10) for i in ids))
    assert results == [(n + 1) * 2 - 3 for n in range(5)]


async def test_wait_timer_registers_and_releases_in_one_commit(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.sleeper, seconds=3600)

        def waiting() -> bool:
            row = sql.execute(
                "SELECT status, lease_token, available_at FROM kenning_instances WHERE id = %s",
                (started.instance_id,),
            ).fetchone()
            return row == ("waiting_for_timer", None, None)

        await eventually(waiting, timeout=10)
        due = sql.execute(
            "SELECT step_id, step_name, due_at - now() > interval '59 minutes' FROM kenning_timers "
            "WHERE instance_id = %s",
            (started.instance_id,),
        ).fetchall()
        assert due == [("wait_timer:1", "wait_timer", True)]
        # cancelling a waiting instance removes its timer and compensates it
        assert await client.cancel(started.instance_id)
        with pytest.raises(WorkflowFailedError, match="cancelled"):
            await client.result(started.instance_id, timeout=10)
    assert sql.execute("SELECT count(*) FROM kenning_timers").fetchone() == (0,)
    assert executions(side_channel)[f"release_stock:sku5:1:r-sku5 {started.instance_id}"] == 1
    assert executions(side_channel)[f"charge {started.instance_id}"] == 0


@pytest.mark.smoke
async def test_wait_event_subscribes_with_correlation_and_releases(
    database: Database, sql: psycopg.Connection[tuple[object, ...]], side_channel: str
) -> None:
    async with Client(database=database) as client, running_worker(database, core.app):
        started = await client.start(core.awaits_payment, order_id="o-9")

        def subscribed() -> list[tuple[object, ...]]:
            return sql.execute(
                "SELECT s.step_id, s.step_name, s.event_type, s.match, s.timeout_at > now() + interval '9 minutes', "
                "i.status, i.lease_token FROM kenning_event_subscriptions s JOIN kenning_instances i "
                "ON i.id = s.instance_id WHERE s.instance_id = %s",
                (started.instance_id,),
            ).fetchall()

        rows = await eventually(subscribed, timeout=10)
        assert rows == [
            (
                "wait_event_payment.completed:1",
                "wait_event:payment.completed",
                "payment.completed",
                {"order_id": "o-9"},
                True,
                "waiting_for_event",
                None,
            )
        ]
