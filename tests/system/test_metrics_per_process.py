"""Each process exports its own metric families, and only the scheduler the database's
gauges (issue 28): scraped from real processes, one of each kind, the ingress with two
uvicorn workers (its multiprocess files held every family a worker created)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from kenning import Client
from kenning.db import Database
from kenning.observability import metrics
from tests.console_support import console_ready, spawn_console
from tests.ingress_support import binary, cloud_event, start_ingress
from tests.metrics_support import figures, scrape_until, value
from tests.relayer_support import relayer_process
from tests.support import ProcessPool, free_port

CORE = "tests.apps.core"
# the gauges of kenning.observability.metrics.DatabaseGauges: read from the database
DATABASE_GAUGES = {
    "kenning_database_metrics_up",
    "kenning_instances",
    "kenning_runnable_instances",
    "kenning_oldest_runnable_age_seconds",
    "kenning_stuck_instances",
    "kenning_pinned_instances_without_worker",
    "kenning_timers",
    "kenning_timers_due",
    "kenning_inbox_backlog",
    "kenning_inbox_oldest_age_seconds",
    "kenning_inbox_retrying",
    "kenning_outbox_backlog",
    "kenning_outbox_oldest_age_seconds",
    "kenning_outbox_retrying",
    "kenning_outbox_dead_letters",
    "kenning_queue_depth",
    "kenning_queue_running",
    "kenning_queue_oldest_age_seconds",
    "kenning_queue_paused",
}


async def text_of(url: str, process: psutil.Popen, timeout: float = 60) -> str:
    """``url``'s scrape, once it answers (fails at once if the process exited)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            assert process.poll() is None, f"the process exited with {process.returncode}"
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(url)
                if response.status_code == 200:
                    assert response.headers["content-type"].startswith("text/plain")
                    return response.text
            assert time.monotonic() < deadline, f"{url} did not answer within {timeout} s"
            await asyncio.sleep(0.1)


def kenning_families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text) if family.name.startswith("kenning_")}


async def test_each_process_exports_its_own_families_and_the_scheduler_the_gauges(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    env = {"KENNING_DATABASE_URL": database_url}
    ports = {name: free_port() for name in ("worker", "scheduler", "relayer")}
    spawned = {
        "worker": processes.worker(database_url, CORE, "--metrics-port", str(ports["worker"])),
        "scheduler": processes.spawn(
            ["scheduler", "--no-migrate", "--metrics-port", str(ports["scheduler"])], env=env, name="scheduler"
        ),
        "relayer": relayer_process(
            processes, database_url, f"http://127.0.0.1:{free_port()}/", "--metrics-port", str(ports["relayer"])
        ),
    }
    ingress = start_ingress(processes, database_url, "--workers", "2")
    console_url, console = spawn_console(processes, database_url)
    await console_ready(console_url, console)

    async with Client(database=database) as client:
        done = await client.start("three_steps", value=1)
        assert await client.result(done.instance_id, timeout=60) == 1
    headers, body = binary(cloud_event("metrics.counted", {"n": 1}))
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(f"{ingress.url}/", headers=headers, content=body)).status_code == 202
        assert (await http.get(f"{console_url}/instances")).status_code == 200

    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    urls |= {"ingress": f"{ingress.url}/metrics", "console": f"{console_url}/metrics"}
    owners = {**spawned, "ingress": ingress.process, "console": console}

    await text_of(urls["worker"], owners["worker"])  # it answers
    steps = "kenning_step_duration_seconds_count"
    await scrape_until(
        urls["worker"],
        lambda f: value(f, steps, workflow="three_steps", step="step_one", outcome="completed") == 1,
        "the worker's step metrics name the workflow",
    )
    scraped = {name: await text_of(url, owners[name]) for name, url in urls.items()}

    for name, text in scraped.items():
        found = kenning_families(text)
        if name == metrics.DATABASE_GAUGES_PROCESS:
            assert found >= DATABASE_GAUGES, sorted(DATABASE_GAUGES - found)
            found &= set(metrics.event_families())  # the rest is the database's
        others = found - metrics.exported_by(name)
        assert others == set(), f"{name} exports families not its own (another's, the database's): {sorted(others)}"
    # so a sum over every process's scrape is the database's figure, not a multiple of it
    every = [figures(text) for text in scraped.values()]
    assert sum(value(f, "kenning_database_metrics_up") for f in every) == 1
    assert value(figures(scraped["ingress"]), "kenning_ingress_requests_total", route="events", status="202") == 1
    console_figures = figures(scraped["console"])
    assert value(console_figures, "kenning_console_requests_total", route="/instances", status="200") == 1
    assert value(console_figures, "process_cpu_seconds_total") > 0  # the process's own collectors


async def test_a_scrape_right_after_the_start_has_each_process_series_at_zero(
    database_url: str, processes: ProcessPool
) -> None:
    """Issue 38, item 5: a labelled family has no series until its first increment, so a
    fresh process's ``/metrics`` held none of its ``kenning_`` counters until something
    happened (and ``rate()`` had no baseline). The series whose labels each process knows at
    its start are there, at 0, in the first scrape, before anything happens."""
    env = {"KENNING_DATABASE_URL": database_url}
    ports = {name: free_port() for name in ("worker", "scheduler", "relayer")}
    owners = {
        "worker": processes.worker(database_url, CORE, "--metrics-port", str(ports["worker"])),
        "scheduler": processes.spawn(
            ["scheduler", "--no-migrate", "--metrics-port", str(ports["scheduler"])], env=env, name="scheduler"
        ),
        "relayer": relayer_process(
            processes, database_url, f"http://127.0.0.1:{free_port()}/", "--metrics-port", str(ports["relayer"])
        ),
    }
    ingress = start_ingress(processes, database_url, "--workers", "2")
    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    first = {name: figures(await text_of(url, owners[name])) for name, url in urls.items()}
    first["ingress"] = figures(await text_of(f"{ingress.url}/metrics", ingress.process))
    expected = {
        "worker": ("kenning_claimed_instances_total", {"workflow": "three_steps"}),
        "scheduler": ("kenning_timer_lateness_seconds_count", {"kind": "timer"}),
        "relayer": ("kenning_outbox_deliveries_total", {"outcome": "dead_letter"}),
        "ingress": ("kenning_ingress_request_duration_seconds_count", {"route": "events"}),
    }
    for name, (series, labels) in expected.items():
        key = (series, frozenset(labels.items()))
        assert first[name].get(key) == 0, f"{name}'s first scrape has no {series}{labels} at 0: {sorted(first[name])}"
