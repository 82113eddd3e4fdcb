"""Every command block of the README and the docs, run as a reader runs it.

The ``bash``/``sh``/``console`` blocks of each document are split into commands and run in
document order in one bash session per document (a reader's terminal), at a reader's pace:
before each command the stack has settled. What the harness does differently from a
reader is all in the tables below:

- ``STEPS``: every command of every document, in order, with the state the document
  describes after it. A command the table does not name fails the test, so a new block
  cannot slip through untested.
- Install lines (``python3 -m venv ...``) are not re-run (this environment is installed):
  they must be the README's "two commands" and ``.ci/run``'s install, letter for letter.
- ``docker compose`` lines are skipped (no Docker engine here) after checking that the
  services they name exist in ``compose.yaml``.
- ``kenning up`` runs as written in its own terminal, in a scratch directory whose ``.venv``
  is this environment. The docs say it takes ports 8000, 9000 and 8300; the harness moves
  them to free ports with ``KENNING_UP_PORT``, ``KENNING_SINK_PORT`` and
  ``KENNING_CONSOLE_PORT`` (its documented variables), so a reader's own ``kenning up`` on
  the standard ports does not fail the test, and rewrites ``127.0.0.1:8000`` /
  ``localhost:8000`` / ``--port 8000`` in the commands (``REWRITES``); the docs' database
  URL becomes the test's database.
- Long-running processes (``kenning scheduler`` ...) run until they report they started,
  then get SIGTERM and must exit 0; ``kenning worker ... &`` stays in the background until
  the session ends.
- Placeholders (``<instance id>``) are taken from earlier output (``PLACEHOLDERS``).
- A python block right after a line "`path.py`:" is a file the reader saves: it is written
  to the scratch directory before the commands run.

The README and the quick start run in one directory, one after the other, as a newcomer
follows them: the quick start's orders must not collide with the README's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import psutil
import psycopg
import pytest
import yaml

from kenning import Client
from kenning.db import Database
from tests import logguard
from tests.apps import forks
from tests.logguard import expect_log
from tests.relayer_support import insert_events
from tests.support import REPO_ROOT, check_invariants, eventually, free_port, running_worker

Sql = psycopg.Connection[tuple[object, ...]]
DOCS = (
    "README.md",
    "docs/quickstart.md",
    "docs/ingress.md",
    "docs/scheduler.md",
    "docs/relayer.md",
    "docs/architecture.md",
    "docs/scaling.md",
    "docs/operations.md",
    "docs/performance.md",
    "docs/amqp.md",
    "docs/nats.md",
    "docs/console.md",
    "docs/guarantees.md",
    "docs/workflows.md",
    "docs/testing.md",
    "docs/streams.md",
    "docs/migrating-from-edda.md",
    "docs/configuration.md",
    "docs/layout.md",
    "docs/development.md",
    "docs/agents.md",
    "docs/mcp.md",
)
COMMAND_LANGUAGES = ("bash", "sh", "shell", "console")
DOC_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"  # docs/ingress.md's
UP_CHILDREN = ("sink", "ingress", "worker-1", "worker-2", "scheduler", "relayer")
DAEMONS = {"worker": "worker.started", "ingress": "ingress.started", "scheduler": "scheduler.started"}
DAEMONS["relayer"] = "relayer.started"
DAEMONS["console"] = "console.started"
INSTANCE_ID = r"[\w.]+-[0-9a-f]{32}"


# ---------------------------------------------------------------- reading the documents


@dataclass(frozen=True)
class Block:
    language: str
    body: str
    line: int


def blocks(doc: str) -> list[Block]:
    text = (REPO_ROOT / doc).read_text()
    return [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    ]


def command_blocks(doc: str) -> list[Block]:
    return [b for b in blocks(doc) if b.language in COMMAND_LANGUAGES]


def split_commands(body: str) -> list[str]:
    """One entry per shell command: a line, with its ``\\`` continuations and any lines an
    open quote spans."""
    commands, pending = [], ""
    for line in body.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if not pending.strip():
            pending = ""
            continue
        if pending.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        commands.append(pending.strip())
        pending = ""
    assert not pending, f"unterminated command: {pending}"
    return commands


def commands_of(doc: str) -> list[str]:
    return [command for block in command_blocks(doc) for command in split_commands(block.body)]


def saved_files(doc: str) -> dict[str, str]:
    """The python blocks a document tells the reader to save ("`shop.py`:" just before)."""
    text = (REPO_ROOT / doc).read_text()
    return dict(re.findall(r"^`([\w/]+\.py)`:\n\n```python\n(.*?)^```", text, flags=re.S | re.M))


def kind(command: str) -> str:
    if command.startswith("python3 -m venv"):
        return "install"
    if command.startswith("docker compose"):
        return "compose"
    if re.match(r"^(\S*/)?kenning up\b", command):
        return "up"
    daemon = re.match(r"^kenning (\w+)\b", command)
    if daemon and daemon.group(1) in DAEMONS:
        return "background" if command.rstrip().endswith("&") else "daemon"
    return "shell"


# ---------------------------------------------------------------- what the docs say happens


@dataclass
class Context:
    cwd: Path
    port: int = 0
    sink_port: int = 0
    database_url: str = ""
    sql: Sql | None = None
    outputs: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)  # seeded dead letters, for <event id>

    def db(self) -> Sql:
        assert self.sql is not None
        return self.sql


Check = Callable[[Context, str], None]


def statuses(ctx: Context, workflow: str, order_id: str) -> list[str]:
    rows = (
        ctx.db()
        .execute(
            "SELECT status FROM kenning_instances WHERE workflow_name = %s AND input ->> 'order_id' = %s",
            (workflow, order_id),
        )
        .fetchall()
    )
    return [str(status) for (status,) in rows]


def order(order_id: str, status: str, workflow: str = "order.created") -> Check:
    """Exactly one instance for this order, in this state."""

    def check(ctx: Context, output: str) -> None:
        assert statuses(ctx, workflow, order_id) == [status], f"order {order_id}"

    return check


def accepted(*order_statuses: tuple[str, str], workflow: str = "order.created") -> Check:
    """202, stored for the first time (curl -i or kenning send), then the orders' states."""

    def check(ctx: Context, output: str) -> None:
        answers = re.findall(r"^(?:HTTP/1\.1 )?(\d{3})\b", output, flags=re.M)
        assert answers and set(answers) == {"202"}, output
        assert '"duplicate":true' not in output.replace(" ", ""), output
        for order_id, status in order_statuses:
            order(order_id, status, workflow)(ctx, output)

    return check


def shows(*patterns: str, then: Check | None = None) -> Check:
    def check(ctx: Context, output: str) -> None:
        for pattern in patterns:
            assert re.search(pattern, output, flags=re.M), f"{pattern!r} not in:\n{output}"
        if then is not None:
            then(ctx, output)

    return check


def both(*checks: Check) -> Check:
    def check(ctx: Context, output: str) -> None:
        for each in checks:
            each(ctx, output)

    return check


def answers(expected: dict[str, Any]) -> Check:
    """The JSON the command printed has these fields."""

    def check(ctx: Context, output: str) -> None:
        got = json.loads(output)
        assert {k: got.get(k) for k in expected} == expected

    return check


def outbox_pending(ctx: Context, output: str) -> None:
    rows = (
        ctx.db().execute("SELECT status, attempts FROM kenning_outbox WHERE id = ANY(%s)", (ctx.event_ids,)).fetchall()
    )
    assert sorted((str(s), int(str(a))) for s, a in rows) == [("pending", 0)] * len(ctx.event_ids)


@dataclass(frozen=True)
class Step:
    prefix: str  # the command starts with this
    check: Check | None = None  # the state the document describes afterwards


SHOW_ID = r"^id\s+order\.created-"
STEPS: dict[str, list[Step]] = {
    "README.md": [
        Step("python3 -m venv .venv"),
        Step(".venv/bin/kenning up"),
        Step("source .kenning/env"),
        Step(".venv/bin/kenning send order.created", accepted(("o-1", "waiting_for_event"))),
        Step(".venv/bin/kenning instances list", shows(r"waiting_for_event", then=order("o-1", "waiting_for_event"))),
        Step(".venv/bin/kenning send payment.completed", accepted(("o-1", "completed"))),
        Step(
            ".venv/bin/kenning instances show <instance id>",
            shows(r"^status\s+completed$", r"ActivityCompleted", r"EventReceived", then=order("o-1", "completed")),
        ),
        Step("curl -i -X POST http://127.0.0.1:8000/", accepted(("o-2", "waiting_for_event"))),
        Step("curl -i -X POST http://127.0.0.1:8000/", accepted(("o-2", "completed"))),
    ],
    "docs/quickstart.md": [
        Step("python3 -m venv .venv"),
        Step("source .venv/bin/activate"),
        Step("kenning up"),
        Step("source .venv/bin/activate"),
        Step("source .kenning/env"),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/", accepted(("1001", "waiting_for_event"))),
        Step("grep payment.requested .kenning/logs/sink.log", shows(r'"subject": "1001"')),
        Step("ID=$(kenning instances list"),
        Step("curl -s -w '\\n' http://127.0.0.1:8000/instances/$ID", shows('"status":"waiting_for_event"')),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/", accepted(("1001", "completed"))),
        Step("curl -s -w '\\n' http://127.0.0.1:8000/instances/$ID", shows('"status":"completed"', "trk-1001")),
        Step("kenning instances show $ID", shows(r"^status\s+completed$", r"TimerExpired")),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/", accepted()),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/", accepted(("1002", "failed"))),
        Step("ID=$(kenning instances list"),
        Step("curl -s -w '\\n' http://127.0.0.1:8000/instances/$ID", shows('"status":"failed"', "declined")),
        Step("kenning instances show $ID", shows(r"^status\s+failed$", r"CompensationExecuted")),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/", accepted(("1003", "waiting_for_event"))),
        Step("ID=$(kenning instances list"),
        Step("curl -i -w '\\n' -X POST http://127.0.0.1:8000/cancel/$ID", accepted(("1003", "cancelled"))),
        Step("curl -s -w '\\n' http://127.0.0.1:8000/instances/$ID", shows('"status":"cancelled"')),
        Step("kenning instances show $ID", shows(r"^status\s+cancelled$", r"CompensationExecuted")),
        Step("kenning send order.created", accepted(("1004", "waiting_for_event"))),
        Step("kenning send payment.completed", accepted(("1004", "completed"))),
        Step("docker compose up --build"),
        Step("docker compose up --build --scale worker=4"),
        Step("docker compose exec worker kenning instances list"),
    ],
    "docs/ingress.md": [
        Step("export KENNING_DATABASE_URL="),
        Step("kenning migrate"),
        Step("kenning worker --app shop &"),
        Step("kenning ingress --port 8000 &"),
        Step(
            "curl -i -X POST http://localhost:8000/", accepted(("1001", "waiting_for_event"), workflow="order.placed")
        ),
        Step("curl -i -X POST http://localhost:8000/", accepted()),
        Step("psql", shows(r"order\.placed-.*completed")),
        Step(
            "curl http://localhost:8000/instances/<id>",
            both(
                answers(
                    {
                        "status": "completed",
                        "result": {"order_id": "1001", "amount": 30, "paid": 30, "payment_source": "/payments"},
                    }
                ),
                order("1001", "completed", "order.placed"),
            ),
        ),
    ],
    "docs/scheduler.md": [
        Step("kenning scheduler", shows(r'"schedules": \{\}')),
        Step("kenning scheduler --app myapp.flows", shows(re.escape('"schedules": {"sweep": "*/5 * * * *"}'))),
    ],
    "docs/relayer.md": [
        Step("kenning relayer --broker-url"),
        Step("kenning outbox list --status failed", lambda ctx, out: shows(*map(re.escape, ctx.event_ids))(ctx, out)),
        Step(
            "kenning outbox list --instance ORDER-1 --json",
            lambda ctx, out: shows(*map(re.escape, ctx.event_ids), r'"status": "failed"')(ctx, out),
        ),
        Step("kenning outbox retry <event id> <event id>", both(shows(r"^retried 2 event\(s\)$"), outbox_pending)),
        Step("kenning outbox retry --all-failed", shows(r"^retried 0 event\(s\)$")),
    ],
    "docs/architecture.md": [],  # no commands: the design, read not run
    "docs/scaling.md": [],  # no commands: settings and figures
    "docs/mcp.md": [],  # no shell commands: an assistant's configuration, as JSON
    "docs/operations.md": [
        # ORDER-7: a forks.saga failed at its third step (seeded by the test below), no worker
        Step("kenning instances show ORDER-7", shows(r"^3\s.*ActivityFailed\s+ship:1\s", r"^status\s+failed$")),
        Step(
            "kenning instances fork ORDER-7 --from-step 3",
            shows(r"^ORDER-7: forked as forks\.saga-[0-9a-f]{32} from step 3 \(ship:1\): 2 earlier record\(s\) kept"),
        ),
        Step("kenning instances show ORDER-7", shows(r"^forked to forks\.saga-[0-9a-f]{32} at step 3 \(pending\)$")),
    ],
    "docs/performance.md": [],  # no commands: the benchmark's figures and what they show
    "docs/amqp.md": [],  # no commands: URL forms, the binding, guarantees
    "docs/nats.md": [],  # no commands: URL forms, the binding, guarantees
    "docs/guarantees.md": [],  # no commands: what holds, and how it is checked
    "docs/workflows.md": [],  # no shell commands: the SDK in Python
    "docs/testing.md": [],  # no shell commands: its Python runs in tests/integration/test_testing_docs.py
    "docs/streams.md": [],  # no shell commands: the SDK in Python, the event format
    "docs/migrating-from-edda.md": [],  # no shell commands: Edda's idioms beside Kenning's, in Python
    "docs/configuration.md": [],  # no commands: generated tables of settings
    "docs/layout.md": [],  # no commands: where the code is
    # no command blocks; its one command runs in tests/system/test_configuration_reference.py
    "docs/development.md": [],
    "docs/agents.md": [
        Step("source .venv/bin/activate"),
        Step("kenning up --app kenning.examples.agent"),
        Step("source .venv/bin/activate"),
        Step("source .kenning/env"),
        Step("ID=$(kenning start support"),
        Step(
            "kenning instances show $ID",
            shows(r"^status\s+waiting_for_message$", r'^approvals\s+\{"pending": \[\{"call_id": "refund-1", "details"'),
        ),
        Step("kenning request $ID approval", answers({"call_id": "refund-1", "approved": True})),
        Step(
            "kenning instances show $ID",
            shows(r"^status\s+completed$", r'^result\s+\{"result": "Order o-1 is delivered\. Refund: 30 refunded'),
        ),
        Step(
            "curl -sN http://127.0.0.1:8000/instances/$ID/streams/agent",
            shows(
                r"^id: 0$",
                r'"event_kind":"function_tool_call"',
                r'"event_kind":"part_delta"',
                r'"event_kind":"deferred_tool_requests"',
                re.escape('{"output":"Order o-1 is delivered. Refund: 30 refunded on o-1.",')
                + re.escape('"event_kind":"agent_output"}'),
                r"^event: close$",
            ),
        ),
    ],
    "docs/console.md": [
        Step("export KENNING_ADMIN_TOKEN="),
        Step("kenning console --app kenning.examples.orders", shows(r'"auth": "admin token"')),
    ],
}

# Placeholders and where their values come from; `<event id>`s are the seeded dead letters, in order.
PLACEHOLDERS: dict[str, Callable[[Context], str]] = {
    "<instance id>": lambda ctx: _latest(ctx, r"order\.created-[0-9a-f]{32}"),  # from `instances list`
    "<id>": lambda ctx: _latest(ctx, r"order\.placed-[0-9a-f]{32}"),  # from the psql query
}


def _latest(ctx: Context, pattern: str) -> str:
    for output in reversed(ctx.outputs):
        found = re.findall(pattern, output)
        if found:
            return str(found[0])
    raise AssertionError(f"no earlier output shows {pattern}")


def substitute(command: str, ctx: Context) -> str:
    """The docs' ports, database and placeholders replaced by this run's."""
    rewrites = {
        "127.0.0.1:8000": f"127.0.0.1:{ctx.port}",
        "localhost:8000": f"localhost:{ctx.port}",
        "--port 8000": f"--port {ctx.port}",
        DOC_DATABASE_URL: ctx.database_url,
    }
    for old, new in rewrites.items():
        command = command.replace(old, new)
    if "<event id>" in command:  # each occurrence is the next seeded dead letter
        for event_id in ctx.event_ids:
            command = command.replace("<event id>", event_id, 1)
    for placeholder, value in PLACEHOLDERS.items():
        if placeholder in command:
            command = command.replace(placeholder, value(ctx))
    return command


def unknown_placeholders(command: str) -> list[str]:
    return [p for p in re.findall(r"<[a-z][\w ]*>", command) if p not in (*PLACEHOLDERS, "<event id>")]


def steps_of(doc: str) -> list[tuple[str, Step]]:
    """The document's commands paired with the table's steps; fails on any the table does
    not know, in either direction."""
    commands, steps = commands_of(doc), STEPS[doc]
    for n, command in enumerate(commands):
        assert n < len(steps), f"{doc} has a command the docs test does not know how to run: {command}"
        assert command.startswith(steps[n].prefix), (
            f"{doc}: command {n + 1} is not what tests/system/test_docs.py expects ({steps[n].prefix!r}):\n{command}"
        )
    assert len(commands) == len(steps), f"{doc} lost commands the docs test runs: {steps[len(commands) :]}"
    return list(zip(commands, steps, strict=True))


# ---------------------------------------------------------------- checks without running


def two_commands() -> dict[str, str]:
    text = (REPO_ROOT / "README.md").read_text()
    return dict(re.findall(r"^\| (run something real|install and run the tests) \| `([^`]+)` \|$", text, flags=re.M))


def install_command() -> str:
    run = two_commands()["run something real"]
    assert run.endswith(" && .venv/bin/kenning up"), run
    return run.removesuffix(" && .venv/bin/kenning up")


def check_install(command: str) -> None:
    assert command == install_command(), f"an install line that is not the README's two commands: {command}"


def compose_services() -> set[str]:
    return set(yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"])


def check_compose(command: str) -> None:
    words = shlex.split(command, comments=True)[2:]
    named = [w.partition("=")[0] for flag, w in itertools.pairwise(words) if flag == "--scale"]
    if words[0] in ("exec", "logs", "run", "restart", "stop"):
        named.append(next(w for w in words[1:] if not w.startswith("-")))
    assert words[0] in ("up", "exec", "logs", "run", "restart", "stop", "down", "ps"), command
    assert set(named) <= compose_services(), f"{command} names a service compose.yaml does not define"


def test_every_command_block_of_the_docs_is_known_to_the_harness() -> None:
    documented = {"README.md", *(f"docs/{p.name}" for p in (REPO_ROOT / "docs").glob("*.md"))}
    assert documented == set(DOCS), "a new document: add its commands to tests/system/test_docs.py"
    for doc in DOCS:
        for command, _ in steps_of(doc):
            if kind(command) == "install":
                check_install(command)
            elif kind(command) == "compose":
                check_compose(command)
            assert not unknown_placeholders(command), f"{doc}: a placeholder the harness cannot fill: {command}"


_CI_INSTALLERS = (".venv/bin/pip install", 'VIRTUAL_ENV="$PWD/.venv" .venv/bin/uv pip install')


def test_the_install_lines_are_the_readme_two_commands_and_what_ci_runs() -> None:
    tests = two_commands()["install and run the tests"]
    install = install_command()
    assert tests == install.replace("'.[embedded]'", "'.[dev]'") + " && .venv/bin/pytest"
    ci = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    venv, pip = install.split(" && ")
    assert venv in ci
    # CI's first install may use uv (faster) with the same arguments; then the README's command
    ci_installs = [
        "install" + line.replace(" --quiet", "").split(" install", 1)[1]
        for line in ci
        if line.startswith(_CI_INSTALLERS) and "-e" in line
    ]
    readme_install = "install" + pip.replace("'.[embedded]'", "'.[dev]'").split(" install", 1)[1]
    assert ci_installs == [readme_install], "CI installs what the README says"


def test_the_readme_and_the_quick_start_post_distinct_events_and_orders() -> None:
    def posted(doc: str) -> tuple[set[str], set[str]]:
        text = "\n".join(commands_of(doc))
        ids = set(re.findall(r'ce-id: ([^"\']+)', text)) | set(re.findall(r"--id (\S+)", text))
        orders = set(re.findall(r'"order_id": "([^"]+)"', text))
        return ids, orders

    readme, quickstart = posted("README.md"), posted("docs/quickstart.md")
    assert readme[0] and quickstart[0]
    assert not readme[0] & quickstart[0] and not readme[1] & quickstart[1]


# ---------------------------------------------------------------- running


def _user_env(**extra: str) -> dict[str, str]:
    """A reader's terminal: no KENNING_* settings, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_") and k != "PYTHONPATH"}
    return {**env, **extra}


class Shell:
    """One bash session, a reader's terminal: commands written to its stdin one by one."""

    def __init__(self, cwd: Path, name: str, env: dict[str, str]) -> None:
        self.cwd, self.name, self.env = cwd, name, env
        self.stderr_path = cwd / f"{name}.stderr"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with open(self.stderr_path, "wb") as stderr:  # curl's meter, the processes' logs
            self.proc = await asyncio.create_subprocess_exec(
                "bash",
                "--noprofile",
                "--norc",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        guard = logguard.current()
        if guard is not None:
            guard.watch_file(f"docs shell {self.name}", self.stderr_path)

    async def run(self, command: str, timeout: float = 60) -> tuple[int, str]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{command}\nprintf '\\n__DONE__ %s\\n' \"$?\"\n".encode())
        await self.proc.stdin.drain()
        text = ""
        while "__DONE__ " not in text:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout=timeout)
            assert line, f"the shell exited during: {command}\n{self.stderr()}"
            text += line.decode()
        output, _, status = text.rpartition("__DONE__ ")
        return int(status.strip()), output.removesuffix("\n")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def close(self) -> None:
        """Ends the background jobs a document started (SIGTERM: they stop cleanly), then the shell."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(AssertionError, TimeoutError, BrokenPipeError, ConnectionResetError):
                await self.run("kill -TERM $(jobs -p) 2>/dev/null; wait", timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), timeout=10)


class Terminal:
    """The first terminal, where ``kenning up`` runs in the foreground until Ctrl-C."""

    def __init__(self, cwd: Path, script: str, env: dict[str, str], name: str) -> None:
        self.cwd, self.name = cwd, name
        self.stdout_path, self.stderr_path = cwd / f"{name}.stdout", cwd / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-c", script],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        guard = logguard.current()
        if guard is not None:
            guard.watch_file(f"{name} (stdout)", self.stdout_path)
            guard.watch_file(f"{name} (stderr)", self.stderr_path)
            logs = cwd / ".kenning" / "logs"
            for child in UP_CHILDREN:  # appended to by every up on this directory: watched once
                if (f"up {child}", logs / f"{child}.log") not in guard.files:
                    guard.watch_file(f"up {child}", logs / f"{child}.log")

    def output(self) -> str:
        return (
            self.stdout_path.read_text(errors="replace") + "\n--- stderr ---\n" + self.stderr_path.read_text()[-3000:]
        )

    async def ready(self) -> None:
        def all_ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()}")
            return bool(re.search(r"^kenning up: all \d+ processes ready", self.stdout_path.read_text(), re.M))

        await eventually(all_ready, timeout=120, interval=0.1, message=f"{self.name} ready")

    def ctrl_c(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=60)

    def group(self) -> list[psutil.Process]:
        """What is left of the terminal's processes (the embedded PostgreSQL stops last)."""
        left = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(proc.pid) == self.proc.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
        return left

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=40)
        for proc in self.group():  # a test that failed half-way
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _quiet(sql: Sql) -> bool:
    """Nothing left to do until the next command: the pace of a reader."""
    row = sql.execute(
        "SELECT (SELECT count(*) FROM kenning_inbox WHERE status = 'pending')"
        " + (SELECT count(*) FROM kenning_outbox WHERE status IN ('pending', 'publishing'))"
        " + (SELECT count(*) FROM kenning_instances"
        "    WHERE status IN ('pending', 'running', 'compensating', 'waiting_for_timer')) AS busy"
    ).fetchone()
    return row == (0,)


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        (assignment,) = shlex.split(line.removeprefix("export "))
        name, _, value = assignment.partition("=")
        values[name] = value
    return values


def _started(shell: Shell, event: str, since: int) -> bool:
    return f'"event": "{event}"' in shell.stderr()[since:]


def _serving(port: int) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    return False


async def _wait_started(shell: Shell, command: str, since: int, where: str, port: int) -> None:
    """A long-running process has started: the ingress answers, the others logged it."""
    process = re.match(r"^kenning (\w+)", command)
    assert process is not None
    message = f"{where}: started\n{shell.stderr()[since:][-3000:]}"
    if process.group(1) == "ingress":
        await eventually(partial(_serving, port), timeout=60, interval=0.1, message=message)
    else:
        await eventually(partial(_started, shell, DAEMONS[process.group(1)], since), timeout=60, message=message)


async def run_document(doc: str, ctx: Context, env: dict[str, str], *, preamble: str = "") -> None:
    """Every command of ``doc`` in one shell, in order; ``kenning up`` in a terminal of its own."""
    for path, source in saved_files(doc).items():
        (ctx.cwd / path).parent.mkdir(parents=True, exist_ok=True)
        (ctx.cwd / path).write_text(source)
    name = Path(doc).stem.lower()
    shell = Shell(ctx.cwd, name, env)
    terminal: Terminal | None = None
    first_terminal: list[str] = []  # the up block's commands, run before `kenning up` in its terminal
    running = False  # a stack (kenning up, or workers in the background) works between commands
    await shell.start()
    try:
        if preamble:
            assert (await shell.run(preamble))[0] == 0
        pairs = steps_of(doc)
        up_block = next((b for b in command_blocks(doc) if any(kind(c) == "up" for c in split_commands(b.body))), None)
        for command, step in pairs:
            what = kind(command)
            where = f"{doc}: {command}"
            if ctx.sql is None and ctx.database_url:
                ctx.sql = psycopg.connect(ctx.database_url, autocommit=True)
            if running:
                await eventually(lambda: _quiet(ctx.db()), timeout=30, message=f"the stack settled before {where}")
            if what == "install":
                check_install(command)
                continue
            if what == "compose":
                check_compose(command)  # no Docker engine here: checked, not run
                continue
            if up_block is not None and command in split_commands(up_block.body) and terminal is None:
                first_terminal.append(command)
                if what != "up":
                    continue
                up_env = _user_env(
                    KENNING_UP_PORT=str(ctx.port),
                    KENNING_SINK_PORT=str(ctx.sink_port),
                    KENNING_CONSOLE_PORT=str(free_port()),  # the docs' commands do not name it
                )
                terminal = Terminal(ctx.cwd, "\n".join(first_terminal), up_env, f"kenning up ({name})")
                await terminal.ready()
                running = True
                ctx.database_url = _env_file(ctx.cwd / ".kenning" / "env")["KENNING_DATABASE_URL"]
                ctx.sql = psycopg.connect(ctx.database_url, autocommit=True)
                continue
            command = substitute(command, ctx)
            since = len(shell.stderr())
            if what == "daemon":  # runs until stopped: started, then SIGTERM, exit 0
                code, output = await shell.run(f"{shlex.join(shlex.split(command, comments=True))} &\n__daemon=$!")
                await _wait_started(shell, command, since, where, ctx.port)
                if step.check is not None:  # what a reader sees: its log lines
                    step.check(ctx, shell.stderr()[since:])
                code, output = await shell.run('kill -TERM "$__daemon"; wait "$__daemon"')
                assert code == 0, f"{where}\nexited {code} on SIGTERM:\n{shell.stderr()[since:]}"
                continue
            code, output = await shell.run(command)
            assert code == 0, f"{where}\nexited {code}:\n{output}\n{shell.stderr()[since:][-3000:]}"
            ctx.outputs.append(output)
            if what == "background":
                await _wait_started(shell, command, since, where, ctx.port)
                running = True
            if step.check is not None:
                if running:
                    await eventually(lambda: _quiet(ctx.db()), timeout=30, message=f"the stack settled after {where}")
                try:
                    step.check(ctx, output)
                except AssertionError as error:
                    raise AssertionError(f"{where}\nprinted:\n{output}\n{error}") from None
        if running:
            await eventually(lambda: _quiet(ctx.db()), timeout=30, message=f"{doc}: the stack settled at the end")
            check_invariants(ctx.db())
        if terminal is not None:  # Ctrl-C in the first terminal
            assert terminal.ctrl_c() == 0, terminal.output()
            await eventually(lambda: not terminal.group(), timeout=30, message=f"{doc}: every process stopped")
            check_up_output_shown(doc, terminal.stdout_path.read_text())
    finally:
        await shell.close()
        if terminal is not None:
            terminal.cleanup()
        if ctx.sql is not None:
            ctx.sql.close()
            ctx.sql = None


def _up_lines(text: str) -> list[tuple[str, str]]:
    """``kenning up: LABEL  rest`` lines as (label, rest); a continued line's label is ""."""
    found = []
    for line in text.splitlines():
        if line.startswith("kenning up: "):
            body = line.removeprefix("kenning up: ")
            label = "" if body.startswith(" ") else body.split()[0]
            found.append((label, body[len(label) :].strip()))
    return found


def _said(lines: list[tuple[str, str]], pattern: str) -> list[str]:
    return [m[1] for _, rest in lines if (m := re.search(pattern, rest))]


def check_up_output_shown(doc: str, real: str) -> None:
    """What ``doc`` shows ``kenning up`` printing at start and at Ctrl-C is what it printed:
    the same lines (pids, paths and ports aside), the schema revision and the count of
    processes. The quick start showed "revision 0001" and "6 processes" while up printed
    the current revision and started seven (the console), and it showed no console line."""
    shown = [_up_lines(b.body) for b in blocks(doc) if b.language == "text" and "kenning up: " in b.body]
    started = next((lines for lines in shown if _said(lines, r"^all (\d+) processes ready")), None)
    stopped = next((lines for lines in shown if ("stopping", "") in lines), None)
    if started is None and stopped is None:
        return
    lines = _up_lines(real)
    if started is not None:
        first_try = next(n for n, (label, _) in enumerate(lines) if label == "try")
        ends = first_try + 1 + sum(1 for label, _ in itertools.takewhile(lambda x: x[0] == "", lines[first_try + 1 :]))
        real_start = lines[:ends]
        assert sorted(label for label, _ in started) == sorted(label for label, _ in real_start), (doc, real)
        for pattern in (r"^all (\d+) processes ready", r"^schema at revision (\w+)"):
            assert _said(started, pattern) == _said(real_start, pattern), (doc, pattern, real)
    if stopped is not None:
        real_stop = lines[lines.index(("stopping", "")) :]
        assert sorted(stopped) == sorted(real_stop), (doc, real)


def _scratch(tmp_path: Path) -> Path:
    """A reader's directory: ``.venv`` is this environment (already installed)."""
    (tmp_path / ".venv").symlink_to(sys.prefix)
    return tmp_path


async def test_the_readme_then_the_quick_start_run_as_written_in_one_directory(tmp_path: Path) -> None:
    """A newcomer follows the README, stops, then follows the quick start in the same
    directory: the data in ``.kenning`` carries over, the orders and event ids do not clash."""
    expect_log("instance.failed", workflow="order.created")  # the quick start's declined payment, order 1002
    cwd = _scratch(tmp_path)
    port, sink_port = free_port(), free_port()
    await run_document("README.md", Context(cwd, port=port, sink_port=sink_port), _user_env())
    await run_document("docs/quickstart.md", Context(cwd, port=port, sink_port=sink_port), _user_env())


async def test_the_agents_page_runs_as_written(tmp_path: Path) -> None:
    """docs/agents.md: the support agent under ``kenning up``, its refund approved from the
    shell, on the fake model (no key, no network)."""
    cwd = _scratch(tmp_path)
    ctx = Context(cwd, port=free_port(), sink_port=free_port())
    await run_document("docs/agents.md", ctx, _user_env())


@pytest.mark.smoke
async def test_the_ingress_page_runs_as_written(database_url: str, tmp_path: Path) -> None:
    """docs/ingress.md: its ``shop.py``, migrate, a worker and an ingress in the background,
    the two curl events, psql and the instance's state over HTTP."""
    ctx = Context(_scratch(tmp_path), port=free_port(), database_url=database_url)
    await run_document("docs/ingress.md", ctx, _user_env(), preamble="source .venv/bin/activate")


async def test_the_scheduler_page_runs_as_written(database_url: str, tmp_path: Path) -> None:
    """docs/scheduler.md, with ``KENNING_DATABASE_URL`` set as its reader has (see the ingress
    page): the scheduler alone, then with the cron schedules of the page's ``myapp/flows.py``."""
    ctx = Context(_scratch(tmp_path), database_url=database_url)
    env = _user_env(KENNING_DATABASE_URL=database_url)
    await run_document("docs/scheduler.md", ctx, env, preamble="source .venv/bin/activate")


async def test_the_console_page_runs_as_written(database_url: str, tmp_path: Path) -> None:
    """docs/console.md: a token made as the page makes it, and the console started with the
    orders app (on a free port: ``KENNING_CONSOLE_PORT``, its documented variable)."""
    ctx = Context(_scratch(tmp_path), database_url=database_url)
    env = _user_env(KENNING_DATABASE_URL=database_url, KENNING_CONSOLE_PORT=str(free_port()))
    await run_document("docs/console.md", ctx, env, preamble="source .venv/bin/activate")


async def test_the_operations_page_runs_as_written(database: Database, database_url: str, tmp_path: Path) -> None:
    """docs/operations.md's fork: ORDER-7, a saga failed at its third step on the code with
    the bug (an in-process worker), shown, forked from step 3 and shown again."""
    expect_log("instance.failed", workflow="forks.saga")
    async with Client(database=database) as client, running_worker(database, forks.app):
        await client.start(forks.saga, instance_id="ORDER-7", order="o-7", amount=40)

        async def failed() -> bool:
            return (await client.status("ORDER-7")).status == "failed"

        await eventually(cast(Any, failed), timeout=20, message="ORDER-7 failed")
    ctx = Context(_scratch(tmp_path), database_url=database_url)
    env = _user_env(KENNING_DATABASE_URL=database_url)
    await run_document("docs/operations.md", ctx, env, preamble="source .venv/bin/activate")


async def test_the_relayer_page_runs_as_written(database: Database, database_url: str, tmp_path: Path) -> None:
    """docs/relayer.md: a relayer starts and stops; the outbox commands run against two dead
    letters of instance ORDER-1, the ids its ``retry`` line names."""
    ids = await insert_events(database, 2, instance_id="ORDER-1", event_type="order.placed")
    with psycopg.connect(database_url, autocommit=True) as sql:
        sql.execute("UPDATE kenning_outbox SET status = 'failed', attempts = 5, last_error = 'HTTP 400'")
    ctx = Context(_scratch(tmp_path), database_url=database_url, event_ids=ids)
    env = _user_env(KENNING_DATABASE_URL=database_url)
    await run_document("docs/relayer.md", ctx, env, preamble="source .venv/bin/activate")
