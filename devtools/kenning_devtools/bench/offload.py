"""Large values through the object store: a worker's peak memory and time storing and
loading 1, 10 and 100 MB values (issue 36, item 2).

Each size runs against a SeaweedFS server (``kenning_devtools.seaweedfs``) this section
starts, in two phases on two fresh worker processes: storing (the workflow's activity
returns the value, written to the store, and a timer suspends the instance; that worker is
then stopped) and loading (a second worker, with the scheduler to fire the timer, replays
the instance, reading the value back for the next activity). Each phase's time and its
worker's peak resident memory (``VmHWM``) above its idle size, as a multiple of the
value's size, are reported; ``above_idle_per_value`` is the larger of the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kenning.client import Client
from kenning_devtools import seaweedfs
from kenning_devtools.bench.processes import fleet
from kenning_devtools.ports import free_ports
from kenning_devtools.seaweedfs import S3Server

APP = "kenning_devtools.bench.offloadflows"
BUCKET = "kenning-bench"
MB = 1_000_000


@contextlib.contextmanager
def _store() -> Iterator[S3Server]:
    """A SeaweedFS server (``kenning_devtools.seaweedfs``) with the bench's bucket."""
    if seaweedfs.missing() is not None:
        raise RuntimeError(f"the offload section needs {seaweedfs.missing()}")
    directory = Path(tempfile.mkdtemp(prefix="kenning-bench-s3-"))
    try:
        with seaweedfs.seaweedfs(directory, free_ports(seaweedfs.PORTS), bucket=BUCKET) as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _above_idle(proc: Any, idle: int) -> int:
    return max(0, _peak_rss(proc.pid) - idle)


async def _until_suspended(client: Client, instance_id: str) -> None:
    """Until the instance waits for its timer: the value is stored and the run ended."""
    deadline = time.monotonic() + 600
    while (await client.status(instance_id)).status != "waiting_for_timer":
        if time.monotonic() > deadline:
            raise RuntimeError(f"instance {instance_id} did not store its value in 600 s")
        await asyncio.sleep(0.05)


async def _one_size(url: str, env: dict[str, str], size: int) -> dict[str, Any]:
    """Store on one worker until the instance suspends, stop it; load on a fresh one."""
    worker_args = (["worker", "--app", APP, "--no-migrate"], "worker.started")
    with fleet(url) as running:
        (storing,) = running.spawn_all([worker_args], env=env)
        store_idle = storing.memory_info().rss
        async with Client(url) as client:
            began = time.monotonic()
            started = await client.start("offload_roundtrip", size=size)
            await _until_suspended(client, started.instance_id)
            store_seconds = time.monotonic() - began
            store_peak = _above_idle(storing, store_idle)
            storing.terminate()
            storing.wait(30)
            loading, _ = running.spawn_all([worker_args, (["scheduler", "--no-migrate"], "scheduler.started")], env=env)
            load_idle = loading.memory_info().rss
            began = time.monotonic()
            length = await client.result(started.instance_id, timeout=600)
            load_seconds = time.monotonic() - began
            load_peak = _above_idle(loading, load_idle)
    if length != size:
        raise RuntimeError(f"the {size // MB} MB value came back as {length} characters")
    return {
        "store_seconds": round(store_seconds, 2),
        "load_seconds": round(load_seconds, 2),
        "store_above_idle_per_value": round(store_peak / size, 2),
        "load_above_idle_per_value": round(load_peak / size, 2),
        "worker_peak_mb": round(max(store_idle + store_peak, load_idle + load_peak) / MB, 1),
        "worker_idle_mb": round(min(store_idle, load_idle) / MB, 1),
        "above_idle_per_value": round(max(store_peak, load_peak) / size, 2),
    }


async def run_offload(url: str, sizes_mb: tuple[int, ...] = (1, 10, 100)) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with _store() as server:
        env = {**server.env, "KENNING_OBJECT_STORE": server.url("bench")}
        for size_mb in sizes_mb:
            results[f"{size_mb}MB"] = await _one_size(url, env, size_mb * MB)
    results["largest_multiple"] = max(r["above_idle_per_value"] for r in results.values())
    return results


if __name__ == "__main__":  # python -m kenning_devtools.bench.offload URL: this section alone
    print(asyncio.run(run_offload(sys.argv[1], tuple(int(s) for s in sys.argv[2:]) or (1, 10, 100))))  # noqa: T201
    os._exit(0)
