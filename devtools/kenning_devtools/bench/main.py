"""``kenning bench``: every section on one scratch database, a table, and a JSON file."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import structlog

from kenning.db.migrate import migrate
from kenning.hosting.config import add_logging_options, add_option, positive_float, positive_int
from kenning.hosting.embedded import postgres_server, with_database
from kenning_devtools.bench import (
    agent,
    console,
    encryption,
    events,
    failover,
    flow,
    ingress_load,
    keyrate,
    lateness,
    limits,
    long,
    offload,
    queued,
    recovery,
    relay,
    result_latency,
    resume,
    scale,
    streams,
    targets,
    throughput,
)
from kenning_devtools.bench.report import render

_log = structlog.get_logger("kenning.bench")

FULL = {
    "workflows": 2000,
    "workers": "1,2,4",
    "finished": 1_000_000,
    "waiting": 100_000,
    "long": (100, 1000),
    "limit_seconds": 10.0,
    "samples": 200,
    "timers": (200, 1.0),
    "ingress_clients": 64,
    "ingress_seconds": 10.0,
    "events_long": (20, 100),
    "result": (200, 50, 1000),  # sequential samples, concurrent callers, concurrent samples
    "relay": (1000, 100, 50, 0.2),  # events, instances, batch size, crash rate after the broker answered
    "scale_rounds": 3,
    "fresh_workers": True,  # the queued section's modes each on workers of their own
    "recovery": (32, 10.0, 5.0),  # instances in flight, activity seconds, lease seconds
    "resume": (100_000, 1000, 500, 5),  # steps, continue_as_new every, early after, resumes sampled
    "stream": (20, 0.05, 100, 1000),  # entries per stream, seconds between them, streams at once, readers of one
    "agent_runs": 50,  # durable agent runs of each kind, one at a time, and as many bare
    "flow_key_rate": (20, 5.0, 3),  # starts per key per period, the period (s), periods of backlog per key
    "flow": (10_000, 1000, 2),  # debounced starts, keys, bursts per key
    "console": ((0, 1, 8), 20.0),  # browsers watching one busy instance, seconds measured for each count
}
QUICK = {
    "workflows": 30,
    "workers": "1,2",
    "finished": 1000,
    "waiting": 100,
    "long": (5, 20),
    "limit_seconds": 0.5,  # pgbench runs whole seconds: 1
    "samples": 10,
    "timers": (10, 0.2),
    "ingress_clients": 8,
    "ingress_seconds": 0.5,
    "events_long": (4, 10),
    "result": (10, 4, 20),
    "relay": (100, 20, 10, 0.2),
    # each round is two throughput runs (about 5 s each, mostly start-up and counter flushes)
    "scale_rounds": 1,
    "fresh_workers": False,
    # one at a time (before issue 25) would take 3 + 10 x 6 s, over 6x lease + run time
    # 6 s: a loaded machine must see one heartbeat renew every lease before the runs end
    "recovery": (10, 6.0, 3.0),
    "resume": (60, 20, 10, 3),
    "stream": (5, 0.02, 4, 20),
    "agent_runs": 10,
    "flow_key_rate": (10, 1.0, 3),
    "flow": (200, 20, 2),
    "console": ((1, 4), 3.0),
}
SECTIONS = (
    "limits",
    "throughput",
    "queued",
    "result",
    "event",
    "timer",
    "stream",
    "ingress",
    "scale",
    "long",
    "events-long",
    "resume",
    "recovery",
    "agent",
    "flow",
)
# run only when named (--sections relay): a correctness count against the machine's brokers, not a speed;
# failover: on a PostgreSQL pair of its own under pg_auto_failover, not the database benchmarked;
# encryption: the throughput run again with payloads sealed, the cost as ratios of one run;
# offload: large values through an object store (SeaweedFS, started by the section)
# console: browsers watching a busy instance, the console's statements and CPU (--console-code compares)
EXTRA_SECTIONS = ("relay", "failover", "encryption", "offload", "console")


def section_list(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    known = (*SECTIONS, *EXTRA_SECTIONS)
    unknown = sorted(set(chosen) - set(known))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown sections {unknown}; choose from {','.join(known)}")
    return chosen


HELP = "measure throughput and latency against limits from the same run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--database-url",
        default="",
        help="server to benchmark on (a scratch database is created there and dropped); "
        "default: KENNING_TEST_DATABASE_URL, a container, or an embedded PostgreSQL",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (seconds, for tests)")
    parser.add_argument("--workflows", type=int, help="workflows per throughput run")
    parser.add_argument("--workers", help="worker process counts, comma-separated (default 1,2,4)")
    parser.add_argument("--concurrency", type=int, default=50, help="instances in flight per worker")
    parser.add_argument("--clients", type=int, default=8, help="client count for pgbench and the limits")
    parser.add_argument(
        "--sections",
        type=section_list,
        default=list(SECTIONS),
        help=f"comma-separated subset of: {','.join(SECTIONS)} (default: all); "
        "also relay (relayers crashing after the broker answered, counted per target) and failover (a primary "
        "lost under pg_auto_failover: promotion to the first step on the new primary) and encryption (the "
        "throughput run with and without KENNING_ENCRYPTION_KEYS: its cost per workflow as ratios)",
    )
    parser.add_argument("--relay-events", type=int, help="events per relay target (default 1000)")
    parser.add_argument(
        "--relay-crash-rate", type=float, help="chance a relayer crashes after each answered batch (default 0.2)"
    )
    parser.add_argument("--amqp-url", default=relay.DEFAULT_AMQP_URL, help="RabbitMQ for the relay section")
    parser.add_argument("--nats-url", default=relay.DEFAULT_NATS_URL, help="NATS JetStream for the relay section")
    parser.add_argument("--samples", type=int, help="event-latency samples (default 200)")
    parser.add_argument("--ingress-clients", type=int, help="concurrent HTTP clients of the ingress run (default 64)")
    parser.add_argument(
        "--ingress-workers", type=int, default=2, help="uvicorn workers of the measured ingress (default 2)"
    )
    parser.add_argument(
        "--recovery-instances", type=positive_int, help="instances in flight on the killed worker (default 32)"
    )
    parser.add_argument(
        "--recovery-activity-seconds", type=positive_float, help="run time of their one activity (default 10)"
    )
    parser.add_argument(
        "--recovery-lease-seconds", type=positive_float, help="both workers' --lease-seconds (default 5)"
    )
    parser.add_argument(
        "--console-code",
        help="the console section's console from this checkout (its shared/ and services/console/), to compare",
    )
    parser.add_argument("--output", default="bench-results/bench.json", help="where to write the JSON")
    add_logging_options(parser)


async def _run_sections(url: str, args: argparse.Namespace, size: dict[str, Any]) -> dict[str, Any]:
    sections: list[str] = args.sections
    results: dict[str, Any] = {}
    workflows = args.workflows or size["workflows"]
    workers = [int(w) for w in (args.workers or size["workers"]).split(",")]
    seconds: dict[str, float] = {}
    clock = time.monotonic()

    def lap(section: str) -> None:
        """Each section's wall time, so a slow one is found without timing them apart."""
        nonlocal clock
        now = time.monotonic()
        seconds[section], clock = round(now - clock, 1), now
        _log.info("bench.section", section=section, seconds=seconds[section])

    if "limits" in sections:
        results["limits"] = {
            "clients": args.clients,
            "pgbench_tps": await asyncio.to_thread(limits.pgbench_tps, url, args.clients, size["limit_seconds"]),
            "insert_per_second": round(await limits.insert_loop_rate(url, args.clients, size["limit_seconds"]), 1),
            "bare_engine": await limits.bare_engine_rate(url, args.clients, workflows),
        }
        lap("limits")
    if "throughput" in sections:
        results["throughput"] = [await throughput.run_throughput(url, workflows, w, args.concurrency) for w in workers]
        lap("throughput")
    if "queued" in sections:  # no queue, a queue without limits, one with limits on
        results["queued"] = await queued.run_queued(
            url, workflows, min(2, max(workers)), args.concurrency, size["fresh_workers"]
        )
        lap("queued")
    if "result" in sections:
        results["result_latency"] = await result_latency.run_result_latency(url, *size["result"])
        lap("result")
    if "event" in sections:
        results["event_latency"] = await events.run_event_latency(url, args.samples or size["samples"])
        lap("event")
    if "timer" in sections:
        results["timer_lateness"] = await lateness.run_timer_lateness(url, *size["timers"])
        lap("timer")
    if "stream" in sections:
        entries, interval, many, readers = size["stream"]
        # the event latency beside it, from this run: the event section's, else a small one of its own
        event_samples = 0 if "event_latency" in results else min(args.samples or size["samples"], 50)
        results["stream_latency"] = await streams.run_stream_latency(
            url, entries, interval, many, readers, event_samples
        )
        lap("stream")
    if "ingress" in sections:
        clients = args.ingress_clients or size["ingress_clients"]
        ingress = await ingress_load.run_ingress(url, clients, size["ingress_seconds"], args.ingress_workers)
        insert_limit = (results.get("limits") or {}).get("insert_per_second")
        if insert_limit is None:  # the limits section was not selected: measure the one limit needed
            insert_limit = round(await limits.insert_loop_rate(url, args.clients, size["limit_seconds"]), 1)
        ingress["insert_limit_per_second"] = insert_limit
        ingress["share_of_insert_limit"] = round(ingress["events_per_second"] / insert_limit, 3)
        results["ingress"] = ingress
        lap("ingress")
    if "scale" in sections:
        results["scale"] = await scale.run_scale(
            url,
            size["finished"],
            size["waiting"],
            workflows,
            min(2, max(workers)),
            args.concurrency,
            size["scale_rounds"],
        )
        lap("scale")
    if "long" in sections:
        results["long"] = await long.run_long(url, *size["long"])
        lap("long")
    if "events-long" in sections:
        results["events_long"] = await events.run_event_chain(url, *size["events_long"])
        lap("events-long")
    if "resume" in sections:  # continue_as_new keeps a resume flat
        results["resume"] = await resume.run_resume(url, *size["resume"])
        lap("resume")
    if "recovery" in sections:
        instances, activity_seconds, lease_seconds = size["recovery"]
        results["recovery"] = await recovery.run_recovery(
            url,
            args.recovery_instances or instances,
            args.recovery_activity_seconds or activity_seconds,
            args.recovery_lease_seconds or lease_seconds,
        )
        lap("recovery")
    if "agent" in sections:
        results["agent"] = await agent.run_agent(url, size["agent_runs"])
        lap("agent")
    if "flow" in sections:  # keyed bursts of debounced starts
        results["flow"] = await flow.run_flow(url, *size["flow"])
        results["flow_key_rate"] = await keyrate.run_key_rate(url, *size["flow_key_rate"])
        lap("flow")
    if "relay" in sections:
        count, instances, batch, rate = size["relay"]
        results["relay"] = await relay.run_relay(
            url,
            args.relay_events or count,
            instances,
            batch,
            args.relay_crash_rate or rate,
            args.amqp_url,
            args.nats_url,
        )
        lap("relay")
    if "failover" in sections:
        results["failover"] = await failover.run_failover()
        lap("failover")
    if "encryption" in sections:
        results["encryption"] = await encryption.run_encryption(url, workflows, min(workers), args.concurrency)
        lap("encryption")
    if "offload" in sections:
        results["offload"] = await offload.run_offload(url, (1,) if size is QUICK else (1, 10, 100))
        lap("offload")
    if "console" in sections:
        watching, watched_seconds = size["console"]
        results["console"] = await console.run_console(url, watching, watched_seconds, args.console_code)
        lap("console")
    results["section_seconds"] = seconds
    return results


def run(args: argparse.Namespace) -> int:
    size = QUICK if args.quick else FULL
    name = f"kenning_bench_{uuid.uuid4().hex[:8]}"
    started = time.time()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    with postgres_server(args.database_url or os.environ.get("KENNING_TEST_DATABASE_URL") or None) as server:
        with psycopg.connect(with_database(server, "postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        url = with_database(server, name)
        try:
            migrate(url)
            results = asyncio.run(_run_sections(url, args, size))
        finally:
            with psycopg.connect(with_database(server, "postgres"), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "configuration": "quick" if args.quick else "full",
        "sections": args.sections,
        "duration_seconds": round(time.time() - started, 1),
        **results,
    }
    report["targets"] = targets.evaluate(report)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(render(report))  # noqa: T201 - the report is this command's output
    _log.info("bench.written", output=str(output))
    return 0
