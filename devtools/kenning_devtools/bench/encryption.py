"""Encryption's cost (issue 36, item 1): the throughput run twice in the same bench, on
the same database, plaintext then with ``KENNING_ENCRYPTION_KEYS`` set for the workers and
the starting client, so every input, step result and result is sealed and opened
(AES-256-GCM). Reported as the ratios of on to off: worker CPU per workflow, client CPU
per workflow and workflows/s, with the seal-and-open time of one payload beside them."""

from __future__ import annotations

import base64
import os
import time
from typing import Any

from kenning import codecs
from kenning_devtools.bench.throughput import run_throughput

# a bench-only key, made per run: nothing it seals outlives the scratch database
_PAYLOAD = {"order_id": "o-123456", "customer": "c-42", "lines": [{"sku": "sku-1", "qty": 2, "price": 9.99}] * 4}


def _seal_open_microseconds(rounds: int = 2000) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        codecs.unseal(codecs.seal(_PAYLOAD))
    return round(1e6 * (time.perf_counter() - started) / rounds, 2)


def _ratio(on: Any, off: Any) -> float | None:
    return round(on / off, 3) if isinstance(on, int | float) and isinstance(off, int | float) and off else None


async def run_encryption(url: str, workflows: int, workers: int, concurrency: int) -> dict[str, Any]:
    off = await run_throughput(url, workflows, workers, concurrency)
    keys = "bench:" + base64.b64encode(os.urandom(32)).decode()
    codecs.configure(keys=keys)
    try:
        seal_open = _seal_open_microseconds()
        on = await run_throughput(url, workflows, workers, concurrency, {codecs.KEYS_VARIABLE: keys})
    finally:
        codecs.configure(keys=os.environ.get(codecs.KEYS_VARIABLE, ""))
    ratios = {
        name: _ratio(on.get(name), off.get(name))
        for name in ("worker_cpu_ms_per_workflow", "client_cpu_ms_per_workflow", "workflows_per_second")
    }
    return {
        "workflows": workflows,
        "workers": workers,
        "off": off,
        "on": on,
        "on_to_off": ratios,
        "seal_and_open_microseconds_per_payload": seal_open,
    }
