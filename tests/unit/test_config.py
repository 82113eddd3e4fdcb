"""One variable, one meaning, read by each process's parser in this process: a setting that
differs per process carries the process's name (``KENNING_SCHEDULER_BATCH_SIZE``), a shared
one means the same everywhere, and an old shared spelling of a per-process setting is
refused. The real commands: ``tests/system/test_config.py``."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kenning.commands.cli import SUBCOMMANDS, build_parser
from kenning.hosting.config import declared_variables
from kenning_ingress.parsing import EventLimits
from kenning_ingress.settings import IngressSettings, settings_from_environment, settings_to_environment
from tests.support import REPO_ROOT

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
