"""Prometheus metrics, scraped from real processes: ``GET /metrics`` on the ingress (every
uvicorn worker's figures summed), ``--metrics-port`` on the worker, scheduler and relayer.

Each test makes something happen and checks the figure that should move: runs and
steps by outcome, the backlog while no worker runs, a timer's lateness, ingress
requests, the outbox's backlog, retries and dead letters.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import psutil
import psycopg
import pytest

from kenning import Client
from kenning.db import Database
from kenning.hosting.scrape import scrape as scrape_text
from kenning.storage.queues import queues_overview
from tests.ingress_support import batch, binary, cloud_event, start_ingress
from tests.logguard import expect_log
from tests.metrics_support import figures, scrape, scrape_until, value
from tests.relayer_support import insert_events, relayer_process
from tests.support import ProcessPool, free_port, run_kenning

CORE = "tests.apps.core"


TIMERS = "tests.apps.timers"


async def metrics_of(port: int, process: psutil.Popen, timeout: float = 60) -> str:
    """The URL of ``process``'s metrics, once it answers (fails at once if it exited)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            assert process.poll() is None, f"the process exited with {process.returncode}"
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(url)).status_code == 200:
                    return url
            assert time.monotonic() < deadline, f"{url} did not answer within {timeout} s"
            await asyncio.sleep(0.1)


async def test_worker_counts_runs_and_steps_by_outcome(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    expect_log("instance.failed")  # the saga told to fail, on purpose
    port = free_port()
    url = await metrics_of(port, processes.worker(database_url, CORE, "--metrics-port", str(port)))
    before = await scrape(url)
    assert ("kenning_database_metrics_up", frozenset()) not in before  # the scheduler's: DATABASE_GAUGES_PROCESS
    async with Client(database=database) as client:
        done = await client.start("three_steps", value=1)
        failed = await client.start("saga", amount=5, fail=True)
        assert await client.result(done.instance_id, timeout=60) == 1
        with pytest.raises(Exception, match="no courier"):
            await client.result(failed.instance_id, timeout=60)
    after = await scrape_until(
        url,
        lambda f: value(f, "kenning_workflow_run_duration_seconds_count", workflow="saga", outcome="failed") > 0,
        "the failed run is counted",
    )
    runs = "kenning_workflow_run_duration_seconds_count"
    assert value(after, runs, workflow="three_steps", outcome="completed") == 1
    assert value(after, runs, workflow="saga", outcome="failed") == 1
    steps = "kenning_step_duration_seconds_count"
    assert value(after, steps, workflow="three_steps", step="step_one", outcome="completed") == 1
    assert value(after, steps, workflow="saga", step="ship", outcome="failed") == 1
    assert value(after, "kenning_claim_duration_seconds_count") >= 1
    assert value(after, "kenning_claimed_instances_total", workflow="saga") == 1
    assert value(after, "kenning_group_commit_batch_size_count", writer="worker_steps") >= 1
    assert value(after, "process_cpu_seconds_total") > 0  # the process's own collectors too


async def test_scheduler_shows_the_backlog_while_no_worker_runs_and_times_the_timers(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    port = free_port()
    scheduler = processes.spawn(
        ["scheduler", "--no-migrate", "--poll-interval", "0.2", "--metrics-port", str(port)],
        env={"KENNING_DATABASE_URL": database_url},
        name="scheduler",
    )
    url = await metrics_of(port, scheduler)
    async with Client(database=database) as client:
        naps = [await client.start("nap", seconds=0.2) for _ in range(3)]
        await asyncio.sleep(0.1)  # the oldest runnable instance ages
        backlog = await scrape(url)
        assert value(backlog, "kenning_runnable_instances", workflow="nap") == 3
        assert value(backlog, "kenning_instances", workflow="nap", status="pending") == 3
        assert value(backlog, "kenning_oldest_runnable_age_seconds", workflow="nap") > 0
        assert value(backlog, "kenning_timer_lateness_seconds_count") == 0

        processes.worker(database_url, TIMERS)
        for started in naps:
            await client.result(started.instance_id, timeout=60)
    # the scheduler times a fire after its commit, which the worker may have acted on first
    drained = await scrape_until(
        url, lambda f: value(f, "kenning_timer_lateness_seconds_count") == 3, "the three fires timed"
    )
    assert value(drained, "kenning_runnable_instances", workflow="nap") == 0  # 0, not gone
    assert value(drained, "kenning_instances", workflow="nap") == 0
    assert value(drained, "kenning_timer_lateness_seconds_count", kind="timer") == 3
    assert value(drained, "kenning_timers") == 0


async def test_ingress_counts_every_workers_requests(database_url: str, processes: ProcessPool) -> None:
    ingress = start_ingress(processes, database_url, "--workers", "2")
    requests = 12
    for n in range(requests):
        # a connection each: the kernel spreads them over both uvicorn workers
        headers, body = binary(cloud_event("metrics.tested", {"n": n}))
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.post(f"{ingress.url}/", headers=headers, content=body)).status_code == 202
    headers, body = batch([cloud_event("metrics.tested", {"n": n}) for n in range(3)])
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.post(f"{ingress.url}/", headers=headers, content=body)).status_code == 202
        assert (await client.get(f"{ingress.url}/instances/nobody")).status_code == 404
    # a request is counted after its response is sent: the first scrape may come before the last count
    await scrape_until(
        f"{ingress.url}/metrics",
        lambda f: value(f, "kenning_ingress_requests_total", route="instances", status="404") == 1,
        "the last request counted",
    )
    # whichever worker answers, it reports both workers' requests
    for _ in range(4):
        found = await scrape(f"{ingress.url}/metrics")
        assert value(found, "kenning_ingress_requests_total", route="events", status="202") == requests + 1
        assert value(found, "kenning_ingress_requests_total", route="instances", status="404") == 1
        assert value(found, "kenning_ingress_request_duration_seconds_count", route="events") == requests + 1
        assert value(found, "kenning_group_commit_batch_size_sum", writer="ingress_inbox") == requests + 3
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.post(f"{ingress.url}/metrics")).status_code == 405  # no event


async def test_relayer_counts_retries_and_dead_letters_the_scheduler_the_outbox(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    broker = f"http://127.0.0.1:{free_port()}/events"  # a broker that refuses every connection
    port = free_port()
    await insert_events(database, 1)
    relayer = relayer_process(
        processes,
        database_url,
        broker,
        "--max-attempts",
        "3",
        "--retry-initial-seconds",
        "1",
        "--retry-max-seconds",
        "1",
        "--metrics-port",
        str(port),
    )
    url = await metrics_of(port, relayer)

    pending = await scrape_until(
        url, lambda f: value(f, "kenning_outbox_deliveries_total", outcome="retry") >= 1, "a retry is counted"
    )
    assert ("kenning_outbox_backlog", frozenset()) not in pending  # the scheduler's (DATABASE_GAUGES_PROCESS)
    gauges = figures((await scrape_text("scheduler", database)).decode())  # its scrape, in-process
    assert value(gauges, "kenning_outbox_backlog") == 1
    assert value(gauges, "kenning_outbox_retrying") == 1
    assert value(gauges, "kenning_outbox_oldest_age_seconds") > 0
    assert value(gauges, "kenning_outbox_dead_letters") == 0

    gone = await scrape_until(
        url,
        lambda f: value(f, "kenning_outbox_deliveries_total", outcome="dead_letter") > 0,
        "the event is a dead letter",
    )
    assert value(gone, "kenning_outbox_deliveries_total", outcome="dead_letter") == 1
    # the counter counts after the commit, when the table already says so
    gauges = figures((await scrape_text("scheduler", database)).decode())
    assert value(gauges, "kenning_outbox_dead_letters") == 1
    assert value(gauges, "kenning_outbox_backlog") == 0


def _refused(args: list[str], env: dict[str, str], database_url: str) -> tuple[int, list[str]]:
    """The exit code and stderr lines of a command that must not start."""
    result = run_kenning(args, {"KENNING_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin", **env}, timeout=60)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    return result.returncode, result.stderr.strip().splitlines()


@pytest.mark.parametrize(
    ("args", "value"),
    [(["worker", "--app", CORE], "70000"), (["scheduler"], "http"), (["relayer", "--broker-url", "http://h/"], "-1")],
)
def test_a_bad_metrics_port_flag_is_refused_with_exit_2(args: list[str], value: str, database_url: str) -> None:
    # as every flag's bad value: the command's usage, then the one line that says what is wrong
    code, lines = _refused([*args, "--no-migrate", "--metrics-port", value], {}, database_url)
    assert code == 2 and "argument --metrics-port" in lines[-1] and repr(value) in lines[-1], lines


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["worker", "--app", CORE], {"KENNING_WORKER_METRICS_PORT": "nine"}, "KENNING_WORKER_METRICS_PORT='nine'"),
        (["relayer", "--broker-url", "http://h/"], {"KENNING_RELAYER_METRICS_PORT": "65536"}, "from 1 to 65535"),
        # the shared spelling would give every process on a host the same port
        (["scheduler"], {"KENNING_METRICS_PORT": "9100"}, "set KENNING_SCHEDULER_METRICS_PORT"),
    ],
)
def test_a_bad_metrics_port_variable_is_one_line_and_exit_2(
    args: list[str], env: dict[str, str], named: str, database_url: str
) -> None:
    code, lines = _refused([*args, "--no-migrate"], env, database_url)
    assert code == 2 and len(lines) == 1 and named in lines[0], lines


def test_a_metrics_port_in_use_is_one_line(database_url: str) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, lines = _refused(["scheduler", "--no-migrate", "--metrics-port", str(port)], {}, database_url)
    # logs come first on stderr: the last line is the command's error, and no traceback
    assert code == 1 and lines[-1].startswith("kenning scheduler: ") and "already in use" in lines[-1], lines


async def test_the_database_gauges_count_every_unfinished_status_and_the_stuck(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    rows = [
        ("p-1", "pending", "now() - interval '2 seconds'", None),
        ("p-2", "pending", "now() + interval '1 hour'", None),  # backing off: not runnable yet
        ("w-1", "waiting_for_timer", "NULL", None),  # no timer row: the stuck check's business
        ("w-2", "waiting_for_event", "NULL", "unknown_workflow"),
        ("c-1", "completed", "NULL", None),
    ]
    for instance_id, status, available_at, reason in rows:
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, available_at, stuck_reason) "
            f"VALUES (%s, 'gauged', %s, {available_at}, %s)",
            (instance_id, status, reason),
        )
    found = figures((await scrape_text("scheduler", database)).decode())
    assert value(found, "kenning_database_metrics_up") == 1
    assert value(found, "kenning_instances", workflow="gauged", status="pending") == 2
    assert value(found, "kenning_instances", workflow="gauged", status="waiting_for_timer") == 1
    assert value(found, "kenning_instances", workflow="gauged", status="waiting_for_event") == 1
    assert value(found, "kenning_instances", workflow="gauged") == 4  # finished ones are not
    assert value(found, "kenning_runnable_instances", workflow="gauged") == 1
    assert 2 <= value(found, "kenning_oldest_runnable_age_seconds", workflow="gauged") < 60
    assert value(found, "kenning_stuck_instances", workflow="gauged", reason="unknown_workflow") == 1
    await database.dispose()
    gone = figures((await scrape_text("scheduler", database)).decode())  # no database: said, not raised
    assert value(gone, "kenning_database_metrics_up") == 0
    assert value(gone, "kenning_instances") == 0


async def test_the_queue_gauges_show_each_queues_depth_leases_oldest_age_and_pause(
    database: Database, sql: psycopg.Connection[tuple[object, ...]]
) -> None:
    sql.execute("INSERT INTO kenning_queues (name, paused) VALUES ('busy', false), ('held', true)")
    rows = [
        ("b-1", "pending", "now() - interval '5 seconds'", False),  # due
        ("b-2", "pending", "now() + interval '1 hour'", False),  # backing off: waits, not due
        ("b-3", "running", "now() + interval '1 minute'", True),  # leased: holds a slot
        ("b-4", "running", "now() - interval '20 seconds'", True),  # its lease expired: claimable
        ("b-5", "completed", "NULL", False),  # finished: in no figure
        ("b-6", "waiting_for_timer", "NULL", False),  # needs no worker: holds no slot
    ]
    for instance_id, status, available_at, leased in rows:
        sql.execute(
            "INSERT INTO kenning_instances (id, workflow_name, status, available_at, queue_name, partition_key, "
            f"lease_token, lease_owner) VALUES (%s, 'queued', %s, {available_at}, 'busy', '', "
            "CASE WHEN %s THEN gen_random_uuid() END, CASE WHEN %s THEN 'w' END)",
            (instance_id, status, leased, leased),
        )
    found = figures((await scrape_text("scheduler", database)).decode())
    assert value(found, "kenning_queue_depth", queue="busy") == 3
    assert value(found, "kenning_queue_running", queue="busy") == 1
    assert 20 <= value(found, "kenning_queue_oldest_age_seconds", queue="busy") < 80
    assert value(found, "kenning_queue_paused", queue="busy") == 0
    # an empty queue has its series, at 0 (a drained backlog reads 0, not "no data")
    assert ("kenning_queue_depth", frozenset({("queue", "held")})) in found
    assert value(found, "kenning_queue_depth", queue="held") == 0
    assert value(found, "kenning_queue_running", queue="held") == 0
    assert value(found, "kenning_queue_oldest_age_seconds", queue="held") == 0
    assert value(found, "kenning_queue_paused", queue="held") == 1
    # the same figures as `kenning queues list`
    async with database.connection() as conn:
        busy = (await queues_overview(conn, "busy"))[0]
    assert (busy.depth, busy.running) == (3, 1)
