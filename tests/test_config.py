"""One variable, one meaning: a setting that differs per process carries the process's name
(``KENNING_SCHEDULER_BATCH_SIZE``), a shared one means the same everywhere, and an old
shared spelling of a per-process setting is refused instead of configuring several
processes at once."""

from __future__ import annotations

import argparse
import json
import os
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kenning.commands.cli import SUBCOMMANDS, build_parser
from kenning.runtime.config import declared_variables
from kenning_ingress.parsing import EventLimits
from kenning_ingress.settings import IngressSettings, settings_from_environment, settings_to_environment
from tests.support import REPO_ROOT, ProcessPool, eventually, kenning_command, run_kenning

# the long-running processes, which one deployment (one .env, one compose file) configures together
SERVICES = ("worker", "scheduler", "relayer", "ingress", "migrate")

# (process, flag, its variable, the shared name it had before)
PER_PROCESS = [
    ("scheduler", "--batch-size", "KENNING_SCHEDULER_BATCH_SIZE", "KENNING_BATCH_SIZE"),
    ("relayer", "--batch-size", "KENNING_RELAYER_BATCH_SIZE", "KENNING_BATCH_SIZE"),
    ("worker", "--lease-seconds", "KENNING_WORKER_LEASE_SECONDS", "KENNING_LEASE_SECONDS"),
    ("relayer", "--lease-seconds", "KENNING_RELAYER_LEASE_SECONDS", "KENNING_LEASE_SECONDS"),
    ("worker", "--shutdown-grace-seconds", "KENNING_WORKER_SHUTDOWN_GRACE_SECONDS", "KENNING_SHUTDOWN_GRACE_SECONDS"),
    ("relayer", "--shutdown-grace-seconds", "KENNING_RELAYER_SHUTDOWN_GRACE_SECONDS", "KENNING_SHUTDOWN_GRACE_SECONDS"),
    ("ingress", "--port", "KENNING_INGRESS_PORT", "KENNING_PORT"),
    ("ingress", "--host", "KENNING_INGRESS_HOST", "KENNING_HOST"),
    ("ingress", "--workers", "KENNING_INGRESS_WORKERS", "KENNING_WORKERS"),
]
SHARED = ["--database-url", "--log-level", "--log-format", "--migrate", "--listen", "--poll-interval", "--health-file"]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``KENNING_*`` of the shell running the tests reaches the parsers."""
    for key in list(os.environ):
        if key.startswith("KENNING_"):
            monkeypatch.delenv(key)
    yield


def subparser(command: str) -> argparse.ArgumentParser:
    parser, _ = build_parser([command])
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = commands.choices[command]
    return chosen


def defaults(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {opt: action.default for action in parser._actions for opt in action.option_strings}


@pytest.mark.parametrize(("process", "flag", "variable", "old"), PER_PROCESS)
@pytest.mark.usefixtures("clean_environment")
def test_a_setting_that_differs_per_process_carries_the_process_name(
    process: str, flag: str, variable: str, old: str
) -> None:
    parser = subparser(process)
    assert declared_variables(parser)[flag] == variable
    assert f"[env {variable};" in " ".join(parser.format_help().split())  # --help names it per flag


@pytest.mark.usefixtures("clean_environment")
def test_a_shared_variable_has_one_name_and_one_default_in_every_process() -> None:
    declared: dict[str, dict[str, Any]] = {}  # variable -> {process: default}
    for process in SERVICES:
        parser = subparser(process)
        found = defaults(parser)
        for flag, variable in declared_variables(parser).items():
            declared.setdefault(variable, {})[process] = found[flag]
    for flag in SHARED:
        variable = "KENNING_" + flag[2:].replace("-", "_").upper()
        assert variable in declared, flag
    differing = {v: by_process for v, by_process in declared.items() if len(set(map(repr, by_process.values()))) > 1}
    assert differing == {}, f"one variable, several defaults (give it a process prefix): {differing}"
    for process, flag, variable, old in PER_PROCESS:
        assert old not in declared, f"{old} is still read ({flag} of kenning {process} is {variable})"


@pytest.mark.parametrize(("process", "flag", "variable", "old"), PER_PROCESS)
@pytest.mark.usefixtures("clean_environment")
def test_the_old_shared_name_is_refused_with_one_line_naming_the_new_one(
    process: str,
    flag: str,
    variable: str,
    old: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(old, "7")
    monkeypatch.setenv(variable, "7")  # setting the new one too does not make the old one right
    with pytest.raises(SystemExit) as exited:
        subparser(process)
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"kenning {process}: error: {old} is no longer read, as it meant different things in different "
        f"processes: set {variable}\n"
    )


def test_the_real_command_refuses_an_old_name_before_it_starts(database_url: str) -> None:
    done = run_kenning(["scheduler"], {"KENNING_DATABASE_URL": database_url, "KENNING_BATCH_SIZE": "7"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "kenning scheduler: error: KENNING_BATCH_SIZE is no longer read, as it meant different things "
        "in different processes: set KENNING_SCHEDULER_BATCH_SIZE"
    ]
    bad = run_kenning(["relayer"], {"KENNING_DATABASE_URL": database_url, "KENNING_RELAYER_BATCH_SIZE": "many"})
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "kenning relayer: error: KENNING_RELAYER_BATCH_SIZE='many' is invalid: invalid literal for int() "
        "with base 10: 'many'"
    ]


async def _started(pool: ProcessPool, proc: Any, event: str) -> dict[str, Any]:
    """The process's ``event`` line (its settings), once it has logged it."""

    def found() -> dict[str, Any]:  # empty until the line is there
        for line in pool.log_of(proc).splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("event") == event:
                return dict(record)
        return {}

    return await eventually(found, timeout=60, message=event)


async def test_one_environment_configures_each_process_by_its_own_names(
    database_url: str, processes: ProcessPool
) -> None:
    shared_env = {
        "KENNING_DATABASE_URL": database_url,
        "KENNING_MIGRATE": "false",
        "KENNING_POLL_INTERVAL": "0.5",  # shared: every process takes it
        "KENNING_SCHEDULER_BATCH_SIZE": "7",  # the scheduler's only
        "KENNING_WORKER_SHUTDOWN_GRACE_SECONDS": "4",  # the worker's only
        "KENNING_RELAYER_LEASE_SECONDS": "12",  # the relayer's only
        "KENNING_BROKER_URL": "http://127.0.0.1:9/",
        "KENNING_APP": "tests.apps.core",
    }
    scheduler = processes.spawn(["scheduler"], env=shared_env, name="scheduler")
    relayer = processes.spawn(["relayer"], env=shared_env, name="relayer")
    worker = processes.spawn(["worker"], env=shared_env, name="worker")
    started = {
        "scheduler": await _started(processes, scheduler, "scheduler.starting"),
        "relayer": await _started(processes, relayer, "relayer.starting"),
        "worker": await _started(processes, worker, "worker.starting"),
    }
    assert started["scheduler"]["batch_size"] == 7
    assert started["relayer"]["batch_size"] == 50
    assert started["worker"]["shutdown_grace_seconds"] == 4.0
    assert started["relayer"]["shutdown_grace_seconds"] == 10.0
    assert started["relayer"]["lease_seconds"] == 12.0
    assert started["worker"]["lease_seconds"] == 30.0
    assert {record["poll_interval"] for record in started.values()} == {0.5}


def test_start_with_an_app_uses_its_db_url(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "dburl_app.py").write_text(
        textwrap.dedent(
            f"""
            from kenning import App, WorkflowContext, workflow

            app = App("dburl", {database_url!r})


            @workflow
            async def greet(ctx: WorkflowContext, name: str) -> str:
                return name
            """
        )
    )
    done = kenning_command(
        "start", "greet", "--app", "dburl_app", "--input", '{"name": "x"}', "--allow-unknown", pythonpath=str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    instance_id = done.stdout.strip()
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT workflow_name FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert row == ("greet",)


@pytest.mark.usefixtures("clean_environment")
def test_the_ingress_hands_every_setting_to_its_uvicorn_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = IngressSettings(
        database_url="postgresql://u@h/d",
        ingress_token="t",
        admin_token="a",
        max_body_bytes=12,
        database_timeout=1.5,
        max_attribute_length=3,
        max_attribute_name_length=4,
        max_extensions=5,
        max_id_length=6,
        read_timeout=7.5,
        max_header_bytes=8,
    )
    for key, value in settings_to_environment(settings).items():
        monkeypatch.setenv(key, value)
    assert settings_from_environment() == settings
    assert settings_from_environment().limits == EventLimits(
        max_attribute_length=3, max_attribute_name_length=4, max_extensions=5, max_id_length=6
    )


@pytest.mark.usefixtures("clean_environment")
def test_every_configuration_table_row_names_the_variable_its_process_reads() -> None:
    read = {
        (flag, variable) for command in SUBCOMMANDS for flag, variable in declared_variables(subparser(command)).items()
    }
    row = re.compile(r"^\| `(KENNING_[A-Z0-9_]+)` / `(--[a-z0-9-]+)", re.M)
    stale = [
        (page.name, variable, flag)
        for page in (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
        for variable, flag in row.findall(page.read_text())
        if (flag, variable) not in read
    ]
    assert stale == []
