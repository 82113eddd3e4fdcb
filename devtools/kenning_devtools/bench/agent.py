"""Kenning's own time per agent step (issue 34, item 5): the same Pydantic AI agent
(kenning_devtools/bench/agentflows.py: a model that answers at once, ``STEPS`` model
requests and tool calls per run) run bare in this process, and durably by a real worker
process, one run at a time from start to result. What the durable run takes beyond the
bare one, over its steps, is Kenning's time per step: the activities' commits, the replay
bookkeeping, the claim and the result's wake-up spread over the run. With events it is
taken against the bare agent given an event handler (Pydantic AI then streams the model's
responses, a cost of its own, not Kenning's). Measured with the
event stream (each model request's events and each tool call's written to the
instance's stream ``agent``) and without it.

Beside it, from the same run: the floor, one single-row insert committed on its own by
one connection (a durable step is at least one such commit: its record, before the next
step starts), and the time per step as a multiple of it; the commits per step (counted by
PostgreSQL, listeners' NOTIFY transactions included); and the worker's CPU per step
beyond the bare agent's, which the machine's other work moves far less than the wall
time."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from kenning.client import Client
from kenning_devtools.bench.cehttp import tree_cpu_seconds
from kenning_devtools.bench.limits import commits, commits_when_alone
from kenning_devtools.bench.processes import fleet
from kenning_devtools.bench.stats import percentile, summary_ms

APP = "kenning_devtools.bench.agentflows"
WARM_UP = 3
COMMIT_SAMPLES = 200  # single-row commits for the floor, before and after the durable runs each


@dataclass
class _Runs:
    """One kind of run: the measured runs' times, and over every run (warm-up included)
    the CPU it took (the worker's, or this process's for the bare agent) and its commits."""

    times_ms: list[float]
    runs: int
    cpu_seconds: float
    commits: int = 0

    def cpu_ms_per_step(self, steps: int) -> float:
        return 1000 * self.cpu_seconds / self.runs / steps


async def _bare(runs: int, events: bool) -> _Runs:
    from kenning_devtools.bench import agentflows

    times = []
    cpu = time.process_time()
    for n in range(WARM_UP + runs):
        began = time.perf_counter()
        await agentflows.bare_run(events)
        if n >= WARM_UP:
            times.append(1000 * (time.perf_counter() - began))
    return _Runs(times, WARM_UP + runs, time.process_time() - cpu)


async def _durable(url: str, workflow: str, runs: int) -> _Runs:
    """``runs`` of ``workflow`` (after the warm-up) on a worker and a client of their own,
    whose commits are counted from before they start until after they have exited (a
    listening backend's transactions reach the statistics when it exits)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with fleet(url) as running:
            worker = running.spawn(["worker", "--app", APP, "--no-migrate"], "worker.started")
            await asyncio.sleep(0.5)  # let it connect and LISTEN
            before = await commits(conn, settle=True)
            cpu = tree_cpu_seconds(worker)
            async with Client(url) as client:
                times = await _durable_ms(client, workflow, runs)
            cpu = tree_cpu_seconds(worker) - cpu
        after = await commits_when_alone(url, conn)
    return _Runs(times, WARM_UP + runs, cpu, after - before - 1)  # less the first read's own


async def _commit_ms(url: str, samples: int) -> list[float]:
    """Single-row inserts on one connection, each its own commit: the floor of a step."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_agent_commit (id bigserial PRIMARY KEY, payload text)")
        times = []
        for _ in range(samples):
            began = time.perf_counter()
            await conn.execute("INSERT INTO bench_agent_commit (payload) VALUES (%s)", ("x" * 32,))
            times.append(1000 * (time.perf_counter() - began))
    return times


async def _durable_ms(client: Client, workflow: str, runs: int) -> list[float]:
    times = []
    for n in range(WARM_UP + runs):
        began = time.perf_counter()
        instance = await client.start(workflow)
        result = await client.result(instance.instance_id, timeout=60)
        if n >= WARM_UP:
            times.append(1000 * (time.perf_counter() - began))
        if not str(result).startswith("done after"):
            raise RuntimeError(f"{workflow} returned {result!r}")
    return times


async def run_agent(url: str, runs: int) -> dict[str, Any]:
    try:
        from kenning_devtools.bench import agentflows
    except ImportError as missing:  # the pydantic-ai extra is not installed
        return {"skipped": f"needs the pydantic-ai extra ({missing})"}
    steps = agentflows.STEPS
    bare = await _bare(runs, events=False)
    bare_streamed = await _bare(runs, events=True)
    floor = await _commit_ms(url, COMMIT_SAMPLES)
    streamed = await _durable(url, "bench_agent", runs)
    quiet = await _durable(url, "bench_agent_quiet", runs)
    floor += await _commit_ms(url, COMMIT_SAMPLES)
    commit_p50 = percentile(floor, 50)

    def kind(durable: _Runs, counterpart: _Runs, name: str) -> dict[str, float]:
        per_step = round((percentile(durable.times_ms, 50) - percentile(counterpart.times_ms, 50)) / steps, 3)
        cpu = durable.cpu_ms_per_step(steps) - counterpart.cpu_ms_per_step(steps)
        return {
            f"kenning_ms_per_step_{name}": per_step,
            f"commits_per_step_{name}": round(durable.commits / durable.runs / steps, 2),
            f"kenning_cpu_ms_per_step_{name}": round(cpu, 3),
            f"per_step_over_commit_{name}": round(per_step / commit_p50, 2),
        }

    return {
        "steps_per_run": steps,
        "bare": summary_ms(bare.times_ms),
        "bare_with_events": summary_ms(bare_streamed.times_ms),
        "durable_with_events": summary_ms(streamed.times_ms),
        "durable_without_events": summary_ms(quiet.times_ms),
        "commit": summary_ms(floor),
        **kind(streamed, bare_streamed, "with_events"),
        **kind(quiet, bare, "without_events"),
    }
