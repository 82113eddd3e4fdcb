"""The console section (issue 37): what browsers watching a busy instance cost the console.

An instance moves on all the time (a step and a ``PAUSE``-second timer, over and over,
through a real worker and scheduler). For each count of watchers, a new one, and that many
clients do
what the instance page's script does: hold its live stream (``/live/<id>``) open and, on
each ``changed`` event, fetch the page again. Over ``seconds`` the console's statements
(counted in the console process, ``countedconsole``), its CPU and the pages fetched are
measured: statements and CPU per second, statements and CPU per page. Ratios on one machine,
not timings: ``--console-code`` runs the console from another checkout (its ``shared/``
and ``services/console/``) to compare two commits with the same load.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from typing import Any

import httpx

from kenning.client import Client
from kenning_devtools.bench.consoleflows import bench_busy
from kenning_devtools.bench.processes import fleet
from kenning_devtools.ports import free_port

APP = "kenning_devtools.bench.consoleflows"
PAUSE = 0.1  # seconds of the busy instance's timer: about 5 changes a second under load
LIVE = re.compile(r'data-live-stream="([^"]+)"')


async def _watch(http: httpx.AsyncClient, page: str, fetched: list[int]) -> None:
    """One browser: the page, then its live stream, fetching the page on each change."""
    first = await http.get(page)
    fetched[0] += 1
    found = LIVE.search(first.text)
    assert found is not None, "the instance page names no live stream"
    async with http.stream("GET", found[1].replace("&amp;", "&")) as stream:
        async for line in stream.aiter_lines():
            if line == "event: changed":
                await http.get(page)
                fetched[0] += 1


def _statements(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


async def run_console(url: str, watchers: tuple[int, ...], seconds: float, code: str | None) -> dict[str, Any]:
    port = free_port()
    with fleet(url) as running:
        counter = running.log_dir / "statements"
        env = {"KENNING_BENCH_STATEMENTS_FILE": str(counter), "KENNING_ADMIN_TOKEN": ""}
        if code is not None:
            root = Path(code)
            env["PYTHONPATH"] = f"{root / 'shared'}:{root / 'services' / 'console'}"
        console = running.spawn(
            ["console", "--port", str(port), "--no-migrate"],
            "console.started",
            env=env,
            module="kenning_devtools.bench.countedconsole",
        )
        running.spawn_all(
            [
                (["worker", "--app", APP, "--no-migrate"], "worker.started"),
                (["scheduler", "--no-migrate"], "scheduler.started"),
            ]
        )
        # each count watches an instance of its own, begun as it begins: its replays (the
        # whole history on every wake) cost the same in every count's measure
        ticks = int((seconds + 10) / PAUSE)
        runs: dict[str, Any] = {}
        async with (
            Client(url) as client,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=30, limits=httpx.Limits(max_connections=200)
            ) as http,
        ):
            for count in watchers:
                started = await client.start(bench_busy, ticks=ticks, pause=PAUSE)
                page = f"/instances/{started.instance_id}"
                fetched = [0]
                tasks = [asyncio.create_task(_watch(http, page, fetched)) for _ in range(count)]
                await asyncio.sleep(2.0)  # the streams open and settle
                statements, cpu, pages = _statements(counter), running.cpu_seconds([console]), fetched[0]
                begun = time.monotonic()
                await asyncio.sleep(seconds)
                took = time.monotonic() - begun
                statements = _statements(counter) - statements
                cpu = running.cpu_seconds([console]) - cpu
                pages = fetched[0] - pages
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                        await task
                await client.cancel(started.instance_id)
                await asyncio.sleep(1.0)  # the streams end before the next count begins
                runs[str(count)] = {
                    "watchers": count,
                    "statements_per_second": round(statements / took, 1),
                    "console_cpu_percent": round(100 * cpu / took, 1),
                    "pages_per_second": round(pages / took, 2),
                    "statements_per_page": round(statements / pages, 1) if pages else None,
                    "console_cpu_ms_per_page": round(1000 * cpu / pages, 1) if pages else None,
                }
    return {"pause_seconds": PAUSE, "seconds": seconds, "console_code": code or "this checkout", "watchers": runs}
