"""Edda 0.16's example programs on Kenning (issue 38, item 6), ported with the edits
docs/migrating-from-edda.md names: ``edda`` imports become ``kenning.compat.edda`` (a thin
layer: ``recur`` is ``continue_as_new``, channels are Kenning's messages, ``app.storage``
and ``handle_cloudevent`` read and write Kenning's tables), the SQLite URL a PostgreSQL
one, a uvicorn ``__main__`` a comment, and, once, ``cloudevents.http`` ``cloudevents.v1.http``.
Each runs as its users run it: its ``main()`` as ``python -m`` beside a worker loading the
same module, an ASGI example's events through ``kenning ingress``.

Before the layer, these imports failed (``recur``, ``send_to``, ``edda.activity`` and the
other submodules, ``app.storage``, ``handle_cloudevent``), or, for with_outbox, the saga
failed at its ``send_event_transactional`` in the workflow body.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from tests import logguard
from tests.ingress_support import start_ingress
from tests.logguard import expect_log
from tests.support import REPO_ROOT, ProcessPool, eventually
from tests.support import kenning_command as kenning
from tests.system.test_edda_examples import EXAMPLE_TIMEOUT, run_main

Sql = psycopg.Connection[tuple[object, ...]]
APPS = "tests.apps.edda"


def status_of(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


async def _only(client: Client, workflow: str) -> str:
    rows = await client.list(workflow=workflow)
    assert len(rows) == 1, rows
    return rows[0].id


async def test_pydantic_saga_validates_and_returns_its_model(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    output = run_main(f"{APPS}.pydantic_saga", database_url)
    found = re.search(r"Workflow started: (\S+)", output)
    assert found is not None, output
    processes.worker(database_url, f"{APPS}.pydantic_saga")
    async with Client(database=database) as client:
        result = await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    assert result["status"] == "completed" and result["total_amount"] == pytest.approx(109.97)
    assert result["message"] == "Order confirmed! Thank you, Alice Johnson!"


async def test_cancellable_workflow_is_cancelled_and_undone_in_reverse(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    worker = processes.worker(database_url, f"{APPS}.cancellable_workflow")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_")}
    main = subprocess.Popen(
        [sys.executable, "-m", f"{APPS}.cancellable_workflow"],
        env={**env, "PYTHONPATH": str(REPO_ROOT), "EDDA_EXAMPLE_DB_URL": database_url},
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the example asks its user to cancel while the payment (10 s) runs
        await eventually(
            lambda: "Processing payment" in processes.log_of(worker), timeout=EXAMPLE_TIMEOUT, message="paying"
        )
        (instance,) = sql.execute("SELECT id FROM kenning_instances").fetchone() or ("",)
        assert kenning("instances", "cancel", str(instance), url=database_url).returncode == 0
        output, _ = main.communicate(timeout=EXAMPLE_TIMEOUT)
    finally:
        if main.poll() is None:
            main.send_signal(signal.SIGKILL)
    guard = logguard.current()
    if guard is not None:
        guard.watch_text("cancellable_workflow", output)
    assert main.returncode == 0, output
    # main() reads the status through Edda's app.storage.get_instance after 15 s
    assert "Final workflow status: cancelled" in output, output
    log = processes.log_of(worker)
    flight, hotel = log.index("[Flight Compensation]"), log.index("[Hotel Compensation]")
    assert flight < hotel, "compensations run last registered first"


async def test_event_waiting_workflow_waits_for_its_event(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    output = run_main(f"{APPS}.event_waiting_workflow", database_url)
    found = re.search(r"\[Main\] Workflow started: (\S+)", output)
    assert found is not None, output
    processes.worker(database_url, f"{APPS}.event_waiting_workflow")
    await eventually(
        lambda: status_of(sql, found[1]) == "waiting_for_event", timeout=EXAMPLE_TIMEOUT, message="it waits"
    )


async def test_event_waiting_workflow_complete_sends_its_event_through_handle_cloudevent(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    processes.worker(database_url, f"{APPS}.event_waiting_workflow_complete")
    output = run_main(f"{APPS}.event_waiting_workflow_complete", database_url)
    found = re.search(r"\[Main\] Workflow started: (\S+)", output)
    assert found is not None, output
    assert "[Main] Current status:" in output, output  # app.storage.get_instance
    async with Client(database=database) as client:
        result = await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    assert result == {"order_id": "ORDER-99999", "status": "completed", "payment_confirmed": True}


async def test_event_waiting_app_resumes_on_an_event_posted_to_the_ingress(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    processes.worker(database_url, f"{APPS}.event_waiting_app")
    ingress = start_ingress(processes, database_url)
    async with Client(database=database) as client:
        started = await client.start("payment_workflow", order_id="ORDER-12345", amount=99.99)
        await eventually(
            lambda: status_of(sql, started.instance_id) == "waiting_for_event",
            timeout=EXAMPLE_TIMEOUT,
            message="it waits",
        )
        headers = {
            "content-type": "application/json",
            "ce-type": "payment.completed",
            "ce-source": "payment-service",
            "ce-id": str(uuid.uuid4()),
            "ce-specversion": "1.0",
        }
        data = {"order_id": "ORDER-12345", "payment_id": "PAY-123", "status": "success", "amount": 99.99}
        async with httpx.AsyncClient(timeout=30) as http:
            posted = await http.post(f"{ingress.url}/", json=data, headers=headers)
        assert posted.status_code == 202, posted.text
        result = await client.result(started.instance_id, timeout=EXAMPLE_TIMEOUT)
    assert result == {"order_id": "ORDER-12345", "status": "completed", "payment_confirmed": True}


async def test_typeddict_example_starts_from_a_cloudevent(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    processes.worker(database_url, f"{APPS}.typeddict_example")
    ingress = start_ingress(processes, database_url)
    headers = {
        "content-type": "application/json",
        "ce-type": "typeddict_user_workflow",
        "ce-source": "example",
        "ce-id": str(uuid.uuid4()),
        "ce-specversion": "1.0",
    }
    # the data under the workflow's parameter name: the docstring's bare data binds as keyword
    # arguments, on Edda 0.16 as on Kenning (only a pydantic model takes the whole data)
    data = {"input": {"user_id": "USER-123", "name": "Alice", "email": "alice@example.com", "age": 30}}
    async with httpx.AsyncClient(timeout=30) as http:
        posted = await http.post(f"{ingress.url}/", json=data, headers=headers)
    assert posted.status_code == 202, posted.text
    async with Client(database=database) as client:
        await eventually(
            lambda: _started(database_url, "typeddict_user_workflow"), timeout=EXAMPLE_TIMEOUT, message="started"
        )
        instance = await _only(client, "typeddict_user_workflow")
        result = await client.result(instance, timeout=EXAMPLE_TIMEOUT)
    assert result["user_id"] == "USER-123" and result["name"] == "Alice", result


def _started(database_url: str, workflow: str) -> bool:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM kenning_instances WHERE workflow_name = %s", (workflow,)).fetchone()
    return row == (1,)


async def test_message_passing_sends_to_one_instance_and_publishes_to_subscribers(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    """send_to is send_message (False for an instance that does not exist); a broadcast
    subscribe is subscribe; receive(channel=...) takes both."""
    processes.worker(database_url, f"{APPS}.message_passing")
    async with Client(database=database) as client:
        waiting = (await client.start("approval_workflow", input={"request_id": "REQ-1"})).instance_id
        await eventually(
            lambda: status_of(sql, waiting) == "waiting_for_message", timeout=EXAMPLE_TIMEOUT, message="it waits"
        )
        approver = (await client.start("approver_workflow", input={"target_id": waiting, "decision": True})).instance_id
        assert (await client.result(approver, timeout=EXAMPLE_TIMEOUT))["status"] == "success"
        approved = await client.result(waiting, timeout=EXAMPLE_TIMEOUT)
        assert approved == {"request_id": "REQ-1", "approved": True, "approver": approver}
        nobody = await client.start("approver_workflow", input={"target_id": "no-such-instance", "decision": False})
        assert (await client.result(nobody.instance_id, timeout=EXAMPLE_TIMEOUT))["status"] == "not_delivered"

        services = [
            (await client.start("notification_service", input={"service_id": f"svc-{n}"})).instance_id for n in (1, 2)
        ]

        def both_subscribed() -> bool:
            row = sql.execute("SELECT count(*) FROM kenning_channel_subscriptions WHERE channel = 'order.created'")
            return row.fetchone() == (2,)

        await eventually(both_subscribed, timeout=EXAMPLE_TIMEOUT, message="both services subscribed")
        order = (await client.start("order_processor", input={"order_id": "ORD-7"})).instance_id
        assert (await client.result(order, timeout=EXAMPLE_TIMEOUT))["status"] == "completed"
        for service in services:
            assert (await client.result(service, timeout=EXAMPLE_TIMEOUT))["status"] == "notified"


async def test_pydantic_rpc_integration_starts_and_reads_status_through_app_storage(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    output = run_main(f"{APPS}.pydantic_rpc_integration", database_url)
    found = re.search(r"Order created: instance_id=(\S+)", output)
    assert found is not None, output
    assert re.search(r"Workflow status: (pending|running|completed)", output), output  # app.storage.get_instance
    processes.worker(database_url, f"{APPS}.pydantic_rpc_integration")
    async with Client(database=database) as client:
        result = await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    assert result["status"] == "completed", result


async def test_retry_example_retries_stops_at_terminal_errors_and_exhausts(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    expect_log("activity.failed")
    expect_log("activity.retry*")
    processes.worker(database_url, f"{APPS}.retry_example")
    output = run_main(f"{APPS}.retry_example", database_url)
    ids = re.findall(r"Instance ID: (\S+)", output)
    assert len(ids) == 5, output
    async with Client(database=database) as client:
        results = [await client.result(i, timeout=EXAMPLE_TIMEOUT) for i in ids]
    assert [r["status"] for r in results] == ["completed", "completed", "failed", "failed_after_retry", "completed"], (
        results
    )
    assert results[0]["result"]["attempts"] == 3, results[0]  # two timeouts, then the answer
    assert results[2]["error"] == "User invalid_user not found", results[2]


async def test_retry_with_compensation_undoes_what_succeeded(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    expect_log("activity.failed")
    expect_log("activity.retry*")
    expect_log("instance.failed")
    worker = processes.worker(database_url, f"{APPS}.retry_with_compensation")
    output = run_main(f"{APPS}.retry_with_compensation", database_url)
    assert "Traceback" not in output, output
    async with Client(database=database) as client:
        outcomes: dict[str, Any] = {}
        for name in ("successful_order_workflow", "failed_order_workflow", "terminal_error_workflow"):
            instance = await _only(client, name)
            try:
                outcomes[name] = (await client.result(instance, timeout=EXAMPLE_TIMEOUT))["status"]
            except Exception as error:  # the failed saga's outcome is its error
                outcomes[name] = type(error).__name__
    assert outcomes == {
        "successful_order_workflow": "completed",
        "failed_order_workflow": "WorkflowFailedError",
        "terminal_error_workflow": "WorkflowFailedError",
    }, outcomes
    # the failed saga undoes its payment, then its reservation (@on_failure, last first);
    # the terminal error's saga had nothing to undo
    log = processes.log_of(worker)
    refund = log.index("[COMPENSATION] Refunding payment for order ORDER-FAIL-001")
    release = log.index("[COMPENSATION] Cancelling reservation for order ORDER-FAIL-001")
    assert refund < release, log
    assert "[COMPENSATION] Cancelling reservation for order ORDER-TERMINAL-001" not in log, log


async def test_with_outbox_writes_each_event_once_for_the_relayer(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql
) -> None:
    processes.worker(database_url, f"{APPS}.with_outbox")
    output = run_main(f"{APPS}.with_outbox", database_url)
    found = re.search(r"\[Main\] Workflow instance started: (\S+)", output)
    assert found is not None, output
    assert re.search(r"\[Main\] Pending outbox events: \d+", output), output  # app.storage's outbox read
    async with Client(database=database) as client:
        result = await client.result(found[1], timeout=EXAMPLE_TIMEOUT)
    assert result["status"] == "completed", result
    rows = sql.execute("SELECT event_type FROM kenning_outbox WHERE instance_id = %s ORDER BY created_seq", (found[1],))
    # order.completed is sent from the workflow body: a step of its own, written once
    assert [r[0] for r in rows.fetchall()] == [
        "inventory.reserved",
        "payment.charged",
        "order.shipped",
        "order.completed",
    ]
