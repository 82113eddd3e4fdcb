"""A real ``kenning ingress`` for the benchmark, and binary-mode CloudEvents built with
the official SDK (``to_binary`` with the JSON format)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import psutil
from cloudevents.core.bindings.http import to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from kenning_devtools.bench.processes import Fleet
from kenning_devtools.ports import free_port

SOURCE = "/kenning/bench"
_FORMAT = JSONFormat()


def binary_event(event_type: str, data: Any, event_id: str | None = None) -> tuple[dict[str, str], bytes]:
    """Headers and body of one binary-mode CloudEvent (a fresh id unless given)."""
    attributes = {"type": event_type, "source": SOURCE, "id": event_id or uuid.uuid4().hex}
    message = to_binary(CloudEvent(attributes, data), _FORMAT)
    return dict(message.headers), message.body


def start_ingress(
    running: Fleet, workers: int = 1, others: Sequence[tuple[Sequence[str], str]] = ()
) -> tuple[str, psutil.Popen]:
    """``kenning ingress`` with ``workers`` uvicorn processes (and ``others``, started
    beside it: see ``Fleet.spawn_all``); returns once every one has started and
    ``GET /readyz`` answers 200."""
    port = free_port()
    proc = running.spawn_all(
        [(["ingress", "--port", str(port), "--workers", str(workers), "--no-migrate"], "ingress.started"), *others]
    )[0]
    log = running.log_of(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"kenning ingress did not become ready:\n{log.read_text(errors='replace')[-2000:]}")
        if log.read_text(errors="replace").count('"ingress.started"') >= workers:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                    return url, proc
        time.sleep(0.05)


def tree_cpu_seconds(proc: psutil.Popen) -> float:
    """CPU of a process and its children (uvicorn's workers)."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = p.cpu_times()
                total += times.user + times.system
    return total
