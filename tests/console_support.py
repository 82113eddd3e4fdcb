"""Helpers for the console's tests: a real ``kenning console`` process, and its forms
posted as a browser posts them (the form's CSRF token, the console's own Origin)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import psutil
import psycopg

from tests.support import ProcessPool, eventually, free_port, until_answering


def spawn_console(
    processes: ProcessPool, database_url: str, *, app: str = "", token: str = "", env: dict[str, str] | None = None
) -> tuple[str, psutil.Popen]:
    """Start ``kenning console`` on a free port; returns its base URL and process."""
    port = free_port()
    args = ["console", "--port", str(port), "--no-migrate"]
    if app:
        args += ["--app", app]
    proc = processes.spawn(
        args,
        env={"KENNING_DATABASE_URL": database_url, "KENNING_ADMIN_TOKEN": token, **(env or {})},
        name="console",
    )
    return f"http://127.0.0.1:{port}", proc


async def console_ready(url: str, proc: psutil.Popen) -> None:
    await until_answering(f"{url}/healthz", proc, "the console")


def instance_status(sql: psycopg.Connection[tuple[object, ...]], instance_id: str) -> str | None:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
    return None if row is None else str(row[0])


async def became(sql: psycopg.Connection[tuple[object, ...]], instance_id: str, status: str) -> None:
    await eventually(
        lambda: instance_status(sql, instance_id) == status, timeout=20, message=f"{instance_id} is {status}"
    )


CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


async def csrf_token(client: httpx.AsyncClient) -> str:
    """The CSRF token this client's forms carry, read from a page's form as a browser has it
    (bound to the client's cookies: the console gives it one on the first request)."""
    found = CSRF_FIELD.search((await client.get("/login")).text)
    assert found is not None, "the login page has no CSRF field"
    return found[1]


def own_origin(client: httpx.AsyncClient) -> str:
    """The ``Origin`` a browser sends with the console's own forms."""
    url = client.base_url
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


async def post_form(client: httpx.AsyncClient, path: str, fields: dict[str, str]) -> httpx.Response:
    """POST a console form as a browser posts it from the console's page: with the CSRF
    token of the client's cookies and the console's own ``Origin``."""
    token = await csrf_token(client)
    return await client.post(path, data={"csrf_token": token, **fields}, headers={"origin": own_origin(client)})


def action_lines(log: str, action: str) -> list[dict[str, Any]]:
    """The console's ``console.action`` log lines of one action."""
    found = []
    for line in log.splitlines():
        if line.startswith("{") and '"console.action"' in line:
            entry = json.loads(line)
            if entry.get("event") == "console.action" and entry.get("action") == action:
                found.append(entry)
    return found
