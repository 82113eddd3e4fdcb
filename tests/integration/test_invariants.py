"""The invariant checker catches what it claims to: each check against rows that break it,
planted in SQL, and its message names them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests import invariants

Sql = psycopg.Connection[tuple[Any, ...]]


def _instance(sql: Sql, instance_id: str, status: str, **columns: Any) -> None:
    names = ["id", "workflow_name", "status", "input", "run_count", *columns]
    values = [instance_id, "planted", status, "{}", 1, *columns.values()]
    sql.execute(
        f"INSERT INTO kenning_instances ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})",
        values,
    )


def _record(sql: Sql, instance_id: str, step_id: str, kind: str, payload: Any = None) -> None:
    sql.execute(
        "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload) VALUES (%s, %s, %s, %s, %s)",
        (instance_id, step_id, kind, step_id.split(":")[0], json.dumps(payload or {})),
    )


def _compensation(sql: Sql, instance_id: str, comp_id: str, position: int) -> None:
    sql.execute(
        "INSERT INTO kenning_compensations (instance_id, comp_id, position, function_name, args, kwargs) "
        "VALUES (%s, %s, %s, 'planted:undo', '[]', '{}')",
        (instance_id, comp_id, position),
    )


def test_a_clean_database_passes(sql: Sql) -> None:
    invariants.check_invariants(sql, max_attempts={"effect": 3}, executions=Counter())


def test_an_instance_with_no_way_forward_is_named(sql: Sql) -> None:
    _instance(sql, "stranded", "waiting_for_timer")
    with pytest.raises(AssertionError, match=r"no way forward.*stranded"):
        invariants.every_instance_has_a_way_forward(sql)


def test_compensations_out_of_order_are_named(sql: Sql) -> None:
    _instance(sql, "saga", "failed")
    _compensation(sql, "saga", "c1", 1)
    _compensation(sql, "saga", "c2", 2)
    _record(sql, "saga", "compensation:c1", "CompensationExecuted")  # oldest first: wrong
    _record(sql, "saga", "compensation:c2", "CompensationExecuted")
    with pytest.raises(AssertionError, match=r"reverse order.*saga"):
        invariants.compensations_once_in_reverse(sql)


def test_a_compensation_never_run_is_named(sql: Sql) -> None:
    _instance(sql, "half-undone", "cancelled")
    _compensation(sql, "half-undone", "c1", 1)
    _compensation(sql, "half-undone", "c2", 2)
    _record(sql, "half-undone", "compensation:c2", "CompensationExecuted")
    with pytest.raises(AssertionError, match=r"never run.*half-undone.*c1"):
        invariants.compensations_once_in_reverse(sql)


def test_attempts_past_the_policy_are_named(sql: Sql) -> None:
    _instance(sql, "retrying", "pending", attempts=json.dumps({"effect:1": {"attempts": 3}}))
    _instance(sql, "exhausted", "failed")
    _record(sql, "exhausted", "effect:2", "ActivityFailed", {"message": "Activity effect failed after 4 attempts: x"})
    invariants.attempts_within_policy(sql, {"effect": 5})
    with pytest.raises(AssertionError, match="retrying"):
        invariants.attempts_within_policy(sql, {"effect": 3})
    _instance(sql, "fine", "completed")
    sql.execute("DELETE FROM kenning_instances WHERE id = 'retrying'")
    with pytest.raises(AssertionError, match=r"more attempts than their policy.*exhausted"):
        invariants.attempts_within_policy(sql, {"effect": 3})


def test_an_effect_without_its_step_is_named(sql: Sql) -> None:
    _instance(sql, "done", "completed")
    _record(sql, "done", "effect:1", "ActivityCompleted")
    ran = Counter({"step done effect:1": 2, "step done effect:2": 1})  # effect:2 ran, never recorded
    with pytest.raises(AssertionError, match="done effect:2"):
        invariants.effects_recorded_once(sql, ran)
    assert invariants.effects_recorded_once(sql, Counter({"step done effect:1": 2}))["done effect:1"] == 2


def test_pending_events_and_outbox_rows_fail_a_settled_run(sql: Sql) -> None:
    sql.execute(
        "INSERT INTO kenning_inbox (kind, source, event_id, event_type, attributes) "
        "VALUES ('event', '/planted', 'e-1', 'planted', '{}')"
    )
    invariants.events_stored_once(sql, settled=False)
    with pytest.raises(AssertionError, match=r"neither processed nor parked.*e-1"):
        invariants.events_stored_once(sql, settled=True)
