"""The whole stack as compose runs it: the services' commands and environment read from
compose.yaml, real processes on free ports, a real PostgreSQL, a real HTTP receiver as the
broker, and the order saga of kenning.examples.orders driven with the CloudEvents SDK."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
import yaml

from tests.ingress_support import binary, cloud_event, structured
from tests.logguard import expect_log
from tests.relayer_support import Receiver, start_receiver
from tests.relayer_support import statuses as outbox_statuses
from tests.support import REPO_ROOT, ProcessPool, check_invariants, eventually, free_port, run_kenning

Sql = psycopg.Connection[tuple[object, ...]]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
PAYMENT_TIMEOUT = 6  # seconds; every order but one is paid or cancelled well before
# What the test changes in compose's settings: where things are, nothing about how they run.
ORDERS_ENV = {"ORDERS_COOLING_OFF_SECONDS": "0.2", "ORDERS_PAYMENT_TIMEOUT_SECONDS": str(PAYMENT_TIMEOUT)}


def _resolve(value: str) -> str:
    """``${VAR:-default}`` as compose expands it with VAR unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


class Stack:
    """compose.yaml's services as local processes."""

    def __init__(self, processes: ProcessPool, database_url: str, broker_url: str, tmp: Path) -> None:
        self.processes = processes
        self.database_url = database_url
        self.broker_url = broker_url
        self.tmp = tmp
        self.port = free_port()
        self.metrics_ports: dict[str, int] = {}
        self.ingress_url = f"http://127.0.0.1:{self.port}"

    def _argv(self, argv: list[str], replica: str) -> list[str]:
        out = []
        for arg in (_resolve(a) for a in argv):
            arg = arg.replace("/tmp/kenning-health", str(self.tmp / f"{replica}.health"))
            arg = arg.replace("http://127.0.0.1:8000/", f"{self.ingress_url}/")
            out.append(arg)
        if "--port" in out:
            assert out[out.index("--port") + 1] == "8000", out
            out[out.index("--port") + 1] = str(self.port)
        if "--host" in out:
            out[out.index("--host") + 1] = "127.0.0.1"  # compose's 0.0.0.0, on loopback only
        return out

    def environment(self, service: str) -> dict[str, str]:
        env = {k: _resolve(str(v)) for k, v in (COMPOSE["services"][service].get("environment") or {}).items()}
        assert env["KENNING_DATABASE_URL"].startswith("postgresql://"), service
        env["KENNING_DATABASE_URL"] = self.database_url
        if "KENNING_BROKER_URL" in env:
            assert env["KENNING_BROKER_URL"] == "http://sink:9000/"
            env["KENNING_BROKER_URL"] = self.broker_url
        for name in [k for k in env if k.endswith("_METRICS_PORT")]:  # each container has its own 9100
            env[name] = str(self.metrics_ports.setdefault(service, free_port()))
        if "KENNING_METRICS_HOST" in env:
            env["KENNING_METRICS_HOST"] = "127.0.0.1"  # compose's 0.0.0.0, on loopback only
        return {**env, **ORDERS_ENV}

    def command(self, service: str, replica: str) -> list[str]:
        return self._argv(list(COMPOSE["services"][service]["command"]), replica)

    def healthcheck(self, service: str, replica: str) -> list[str]:
        test = COMPOSE["services"][service]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "kenning"], test
        return self._argv(list(test[2:]), replica)

    def run_to_completion(self, service: str) -> subprocess.CompletedProcess[str]:
        return run_kenning(self.command(service, service), self.processes_env(service))

    def processes_env(self, service: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.environment(service)}

    def start(self, service: str, replica: str) -> psutil.Popen:
        return self.processes.spawn(self.command(service, replica), env=self.environment(service), name=replica)

    async def healthy(self, service: str, replica: str) -> bool:
        check = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kenning",
            *self.healthcheck(service, replica),
            env=self.processes_env(service),
            cwd=REPO_ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await asyncio.wait_for(check.wait(), timeout=30) == 0


def _instance_id(sql: Sql, source: str, event_id: str) -> str | None:
    key = "cloudevent:" + json.dumps([source, event_id])
    row = sql.execute("SELECT id FROM kenning_instances WHERE idempotency_key = %s", (key,)).fetchone()
    return str(row[0]) if row else None


def _history(sql: Sql, instance_id: str) -> list[tuple[str, str]]:
    rows = sql.execute(
        "SELECT kind, step_name FROM kenning_history WHERE instance_id = %s ORDER BY seq", (instance_id,)
    ).fetchall()
    return [(str(k), str(n)) for k, n in rows]


def _payment_requests(receiver: Receiver, order_id: str) -> list[dict[str, Any]]:
    found = []
    for event in receiver.events():
        data = event.get("data") or {}
        if event.get("attributes", {}).get("type") == "payment.requested" and data.get("order_id") == order_id:
            found.append(event)
    return found


class Shop:
    """Posts the order saga's events to the ingress with the CloudEvents SDK."""

    def __init__(self, http: httpx.Client, stack: Stack, sql: Sql, receiver: Receiver) -> None:
        self.http = http
        self.stack = stack
        self.sql = sql
        self.receiver = receiver
        self.run = uuid.uuid4().hex[:8]

    def post(self, headers_body: tuple[dict[str, str], bytes]) -> dict[str, Any]:
        response = self.http.post(f"{self.stack.ingress_url}/", headers=headers_body[0], content=headers_body[1])
        assert response.status_code == 202, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def order(self, name: str, amount: int) -> tuple[str, str]:
        """Post ``order.created``; returns (order id, instance id) once the instance exists."""
        order_id = f"{name}-{self.run}"
        data = {"order_id": order_id, "items": [{"sku": "book", "qty": 2}, {"sku": "pen", "qty": 1}], "amount": amount}
        event = cloud_event("order.created", data, source="/shop", id=f"order-{order_id}")
        assert self.post(binary(event)) == {
            "status": "accepted",
            "source": "/shop",
            "id": f"order-{order_id}",
            "duplicate": False,
        }
        instance_id = await eventually(
            lambda: _instance_id(self.sql, "/shop", f"order-{order_id}"), message=f"{order_id} started"
        )
        assert instance_id is not None
        return order_id, instance_id

    async def payment_requested(self, order_id: str, instance_id: str, amount: int) -> None:
        """The relayer delivered ``payment.requested`` for this order to the broker."""
        (arrived, *_) = await eventually(
            lambda: _payment_requests(self.receiver, order_id), message=f"payment.requested for {order_id}"
        )
        attributes = arrived["attributes"]
        assert arrived["answer"] == 200 and arrived["mode"] == "binary"
        assert arrived["data"] == {"order_id": order_id, "amount": amount}
        assert attributes["type"] == "payment.requested"
        assert attributes["source"] == "examples/orders"
        assert attributes["subject"] == order_id
        assert attributes["specversion"] == "1.0"
        assert attributes["datacontenttype"] == "application/json"
        # the CloudEvents id is the one request_payment returned, in the same transaction
        recorded = self.sql.execute(
            "SELECT payload ->> 'result' FROM kenning_history WHERE instance_id = %s AND step_name = 'request_payment'",
            (instance_id,),
        ).fetchone()
        assert recorded is not None and attributes["id"] == recorded[0]

    def pay(self, order_id: str, status: str) -> None:
        event = cloud_event(
            "payment.completed",
            {"order_id": order_id, "status": status, "payment_id": f"pay-{order_id}"},
            source="/payments",
            id=f"payment-{order_id}",
        )
        assert self.post(structured(event))["duplicate"] is False

    def instance(self, instance_id: str) -> dict[str, Any]:
        response = self.http.get(f"{self.stack.ingress_url}/instances/{instance_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def settled(self, instance_id: str, status: str) -> dict[str, Any]:
        """GET /instances/{id} once it reports ``status``."""

        def reached() -> dict[str, Any]:
            body = self.instance(instance_id)
            return body if body["status"] == status else {}

        return await eventually(reached, timeout=PAYMENT_TIMEOUT + 15, message=f"{instance_id} {status}")


@pytest.mark.smoke
async def test_the_order_saga_through_the_stack_as_compose_runs_it(
    database_url: str, sql: Sql, processes: ProcessPool, tmp_path: Path
) -> None:
    expect_log("instance.failed", workflow="order.created")  # the declined and the late order
    receiver = await start_receiver(processes)
    stack = Stack(processes, database_url, receiver.url, tmp_path)
    migrated = stack.run_to_completion("migrate")  # the one-shot service, as compose runs it first
    assert migrated.returncode == 0, migrated.stderr
    replicas = [("ingress", "ingress"), ("worker", "worker"), ("scheduler", "scheduler"), ("relayer", "relayer")]
    started = {replica: stack.start(service, replica) for service, replica in replicas}

    def up(replica: str) -> bool:  # cheap polling; compose's own healthcheck is run once below
        assert started[replica].is_running(), processes.log_of(started[replica])
        if replica == "ingress":
            try:
                return httpx.get(f"{stack.ingress_url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        return (tmp_path / f"{replica}.health").exists()

    for _, replica in replicas:
        await eventually(partial(up, replica), timeout=30, interval=0.05, message=f"{replica} up")
    checks = await asyncio.gather(*(stack.healthy(s, r) for s, r in replicas))
    assert checks == [True] * len(replicas), "compose's healthchecks fail against the running services"
    for service, port in stack.metrics_ports.items():  # compose's metrics settings serve Prometheus text
        scrape = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scrape.status_code == 200 and "kenning_" in scrape.text, service

    with httpx.Client(timeout=10) as http:
        shop = Shop(http, stack, sql, receiver)

        # Never paid: the scheduler times the wait out, the workflow catches it and compensates.
        late_order, late = await shop.order("late", 5)

        # Paid: payment.requested reaches the broker, payment.completed resumes the order.
        paid_order, paid = await shop.order("paid", 42)
        duplicate = cloud_event("order.created", {"order_id": paid_order}, source="/shop", id=f"order-{paid_order}")
        assert shop.post(binary(duplicate))["duplicate"] is True  # the broker's retry starts nothing
        await shop.payment_requested(paid_order, paid, 42)
        shop.pay(paid_order, "approved")
        body = await shop.settled(paid, "completed")
        assert body["result"] == {"order_id": paid_order, "tracking": f"trk-{paid_order}"}
        assert body["workflow"] == "order.created" and body["finished_at"] and "error" not in body
        assert _history(sql, paid) == [
            ("ActivityCompleted", "reserve_inventory"),
            ("ActivityCompleted", "request_payment"),
            ("EventReceived", "wait_event:payment.completed"),
            ("ActivityCompleted", "capture_payment"),
            ("TimerExpired", "wait_timer"),
            ("ActivityCompleted", "ship"),
        ]
        row = sql.execute("SELECT status, result FROM kenning_instances WHERE id = %s", (paid,)).fetchone()
        assert row == ("completed", {"result": {"order_id": paid_order, "tracking": f"trk-{paid_order}"}})

        # Declined: the reservation is released, the order fails with the reason.
        declined_order, declined = await shop.order("declined", 17)
        await shop.payment_requested(declined_order, declined, 17)
        shop.pay(declined_order, "declined")
        body = await shop.settled(declined, "failed")
        assert body["error"] == {
            "type": "kenning.errors.TerminalError",
            "message": f"payment for order {declined_order} was declined",
        }
        assert _history(sql, declined)[2:] == [
            ("EventReceived", "wait_event:payment.completed"),
            ("CompensationExecuted", "kenning.examples.orders:release_inventory"),
        ]

        # Cancelled through the ingress while it waits for its payment.
        cancelled_order, cancelled = await shop.order("cancelled", 8)
        await shop.settled(cancelled, "waiting_for_event")
        response = http.post(f"{stack.ingress_url}/cancel/{cancelled}")
        assert response.status_code == 202 and response.json() == {"status": "accepted", "instance_id": cancelled}
        assert http.post(f"{stack.ingress_url}/cancel/no-such-order").status_code == 404
        body = await shop.settled(cancelled, "cancelled")
        assert body["cancel_requested"] is True and "result" not in body
        assert _history(sql, cancelled) == [
            ("ActivityCompleted", "reserve_inventory"),
            ("ActivityCompleted", "request_payment"),
            ("CompensationExecuted", "kenning.examples.orders:release_inventory"),
        ]

        body = await shop.settled(late, "failed")
        assert body["error"]["message"] == f"no payment for order {late_order} within {PAYMENT_TIMEOUT} s"
        assert [kind for kind, _ in _history(sql, late)][2:] == ["EventTimeout", "CompensationExecuted"]

    # The relayer publishes each order's payment.requested, then marks its row, in transactions
    # of its own: the orders can settle before both (the cancelled one was never waited for).
    orders = (late_order, paid_order, declined_order, cancelled_order)
    await eventually(
        lambda: all(_payment_requests(receiver, o) for o in orders),
        timeout=30,
        message="every order's payment.requested at the receiver",
    )
    await eventually(
        lambda: outbox_statuses(sql) == {"published": 4}, timeout=30, message="the four outbox rows published"
    )
    assert all(p.is_running() for p in started.values()), "a service crashed during the run"
    logs = {replica: processes.log_of(proc) for replica, proc in started.items()}
    assert '"compensation.executed"' in logs["worker"] and '"scheduler.started"' in logs["scheduler"]
    check_invariants(sql)
