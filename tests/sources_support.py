"""Helpers for the broker-source tests: an ingress consuming a broker, its log lines, and
what its HTTP endpoint answers the same malformed event."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import psutil

from tests.ingress_support import Ingress, start_ingress
from tests.support import ProcessPool


def start_consuming_ingress(
    processes: ProcessPool,
    database_url: str,
    *sources: str,
    env: dict[str, str] | None = None,
    flags: Sequence[str] = (),
) -> Ingress:
    """``kenning ingress --source ...`` serving (its sources connect on their own), with
    ``flags`` besides."""
    source_flags = [arg for url in sources for arg in ("--source", url)]
    return start_ingress(processes, database_url, "--database-timeout", "5", *source_flags, *flags, env=env)


def log_events(processes: ProcessPool, process: psutil.Popen, event: str) -> list[dict[str, Any]]:
    """The process's JSON log lines whose ``event`` is ``event``, in order."""
    found = []
    for line in processes.log_of(process).splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def consuming(processes: ProcessPool, process: psutil.Popen) -> bool:
    return bool(log_events(processes, process, "source.consuming"))


def http_answer(ingress: Ingress, headers: dict[str, str], body: bytes) -> tuple[str, str]:
    """``(error, error_type)`` the ingress's HTTP endpoint answers this request (a 400)."""
    response = httpx.post(f"{ingress.url}/", headers=headers, content=body, timeout=5)
    assert response.status_code == 400, response.text
    answer = response.json()
    return answer["error"], answer["error_type"]
