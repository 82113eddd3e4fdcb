"""The ``kenning`` command answers mistakes in one line, through the real process.

A user's mistake (bad input, an unknown workflow or instance, an unreachable ingress, a
``--wait`` that ran out, an unmigrated database, a bad ``--app``) is one line on stderr
and exit code 2; anything unexpected is one line and a hint to rerun at debug level; a
reader that closes the pipe ends the command quietly. Never a traceback.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kenning.db import Database
from tests.logguard import expect_log
from tests.support import REPO_ROOT, ProcessPool, eventually
from tests.support import kenning_command as kenning

APP = "tests.apps.core"


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The single stderr line of a failed command, checked to be exactly that."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == code, output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_input_that_does_not_fit_the_workflow_is_one_line(database_url: str) -> None:
    wrong = kenning("start", "three_steps", "--app", APP, "--input", '{"nope": 1}', url=database_url)
    line = one_error_line(wrong)
    assert line.startswith("kenning start: invalid input for workflow 'three_steps'"), line
    assert "value" in line  # names the missing argument


def test_a_model_that_does_not_validate_names_each_bad_field_in_one_line(database_url: str) -> None:
    """Pydantic's message is one line per field under a count ("2 validation errors for
    Order"), of which the CLI showed the count only: every field is named on one line."""
    data = json.dumps({"order": {"order_id": 5, "items": [{"sku": "a", "qty": "many"}]}})
    wrong = kenning("start", "typed", "--app", APP, "--input", data, url=database_url)
    line = one_error_line(wrong)
    assert line.startswith("kenning start: invalid input for workflow 'typed': order.order_id: "), line
    assert "order.items.0.qty: Input should be a valid integer" in line, line
    assert "validation error" not in line, line


def test_an_unexpected_error_is_one_line_with_a_hint_and_the_traceback_at_debug(
    database_url: str, tmp_path: Path
) -> None:
    expect_log("command.error")  # the traceback, at debug level only
    (tmp_path / "exploding_app.py").write_text("raise RuntimeError('boom at import')\n")
    crashed = kenning("start", "three_steps", "--app", "exploding_app", url=database_url, pythonpath=str(tmp_path))
    line = one_error_line(crashed, code=1)
    assert "RuntimeError: boom at import" in line and "rerun with --log-level debug" in line, line
    debug = kenning(
        "start",
        "three_steps",
        "--app",
        "exploding_app",
        "--log-level",
        "debug",
        url=database_url,
        pythonpath=str(tmp_path),
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "exploding_app.py" in debug.stderr


def test_starting_a_workflow_never_registered_is_refused_unless_allowed(database_url: str) -> None:
    refused = kenning("start", "no.such.workflow", url=database_url)
    line = one_error_line(refused)
    assert "no workflow 'no.such.workflow' was ever registered" in line and "--allow-unknown" in line, line
    assert json.loads(kenning("instances", "list", "--json", url=database_url).stdout) == []

    assert kenning("start", "three_steps", "--app", APP, "--input", '{"value": 1}', url=database_url).returncode == 0
    typo = kenning("start", "three_step", "--input", '{"value": 1}', url=database_url)
    assert "did you mean 'three_steps'?" in one_error_line(typo)
    # once registered, the name is known without --app (its input is checked by the worker)
    assert kenning("start", "three_steps", "--input", '{"value": 2}', url=database_url).returncode == 0

    allowed = kenning("start", "no.such.workflow", "--allow-unknown", url=database_url)
    assert allowed.returncode == 0, allowed.stderr


async def test_a_worker_reports_instances_of_an_unknown_workflow_once_per_name(
    database: Database, database_url: str, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=30)
    # the worker registered its workflows: starting one by name needs no --app
    known = kenning("start", "three_steps", "--input", '{"value": 1}', url=database_url)
    assert known.returncode == 0, known.stderr

    def start_unknown(name: str) -> str:
        started = kenning("start", name, "--allow-unknown", url=database_url)
        assert started.returncode == 0, started.stderr
        return started.stdout.strip()

    def reported(name: str) -> int:
        lines = [json.loads(line) for line in processes.log_of(worker).splitlines() if line.startswith("{")]
        return sum(1 for e in lines if e["event"] == "instance.unknown_workflow" and e["workflow"] == name)

    first = start_unknown("no.such.workflow")
    await eventually(lambda: reported("no.such.workflow") == 1, timeout=30)
    start_unknown("no.such.workflow")
    start_unknown("other.missing")
    # a check after the second start of the same name has run: it is not reported again
    await eventually(lambda: reported("other.missing") == 1, timeout=30)
    assert reported("no.such.workflow") == 1
    event = next(
        json.loads(line) for line in processes.log_of(worker).splitlines() if '"instance.unknown_workflow"' in line
    )
    assert event["level"] == "warning"

    shown = kenning("instances", "show", first, url=database_url)
    assert shown.returncode == 0 and "no worker has this workflow" in shown.stdout
    listed = json.loads(kenning("instances", "list", "--workflow", "three_steps", "--json", url=database_url).stdout)
    known_shown = kenning("instances", "show", listed[0]["id"], url=database_url)
    assert "no worker has this workflow" not in known_shown.stdout


def test_errors_carry_the_right_label(database_url: str) -> None:
    unreachable = kenning("send", "order.created", "--data", "{}", "--ingress-url", "http://127.0.0.1:1")
    line = one_error_line(unreachable)
    assert "cannot reach the ingress at http://127.0.0.1:1" in line and "database" not in line, line

    started = kenning("start", "three_steps", "--app", APP, "--input", '{"value": 1}', url=database_url)
    instance_id = started.stdout.strip()
    waited = kenning(
        "start",
        "three_steps",
        "--app",
        APP,
        "--input",
        '{"value": 1}',
        "--instance-id",
        instance_id,
        "--wait",
        "0.2",
        url=database_url,
    )
    line = one_error_line(waited)
    assert f"instance {instance_id} still pending after 0.2 s" in line and "database" not in line, line

    unknown = kenning("instances", "show", "nope", url=database_url)
    assert "no workflow instance 'nope'" in one_error_line(unknown)


def test_a_closed_pipe_ends_the_command_quietly(database_url: str) -> None:
    assert kenning("start", "three_steps", "--app", APP, "--input", '{"value": 1}', url=database_url).returncode == 0
    env = {"PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json", "KENNING_DATABASE_URL": database_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kenning", "instances", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes, as `| head` after its lines
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert stderr == ""


def test_an_unmigrated_database_asks_for_kenning_migrate(empty_database_url: str) -> None:
    for args in (("instances", "list"), ("instances", "show", "x"), ("start", "anything")):
        line = one_error_line(kenning(*args, url=empty_database_url))
        assert "run `kenning migrate`" in line and "does not exist" not in line, line


def test_a_missing_app_attribute_is_named_as_missing(database_url: str) -> None:
    missing = kenning("start", "three_steps", "--app", "examples.orders:nope", url=database_url)
    line = one_error_line(missing)
    assert "examples.orders has no attribute 'nope'" in line, line
    typo = kenning("start", "three_steps", "--app", f"{APP}:ap", url=database_url)
    assert "did you mean 'app'?" in one_error_line(typo)
    not_an_app = kenning("start", "three_steps", "--app", f"{APP}:three_steps", url=database_url)
    assert "is not a kenning.App" in one_error_line(not_an_app)


@pytest.mark.parametrize(
    ("args", "usage", "hint"),
    [
        (("start", "x", "--wiat", "3"), "usage: kenning start ", "did you mean --wait?"),
        (("instances", "list", "--staus", "failed"), "usage: kenning instances list ", "did you mean --status?"),
        (("strat", "x"), "usage: kenning ", "did you mean 'start'?"),
        (("instances", "shwo", "x"), "usage: kenning instances ", "did you mean 'show'?"),
        (("instances", "list", "--status", "faild"), "usage: kenning instances list ", "did you mean 'failed'?"),
    ],
)
def test_a_mistyped_command_or_flag_shows_the_subcommand_usage_and_a_suggestion(
    args: tuple[str, ...], usage: str, hint: str
) -> None:
    result = kenning(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(usage), result.stderr
    assert hint in result.stderr.splitlines()[-1], result.stderr


def test_version() -> None:
    result = kenning("--version")
    expected = f"kenning {importlib.metadata.version('kenning')}"
    assert result.returncode == 0 and result.stdout.strip() == expected, result.stdout + result.stderr


def test_values_postgresql_cannot_take_are_one_line_naming_them(database_url: str) -> None:
    """(issue 33, item 5) A lone surrogate (an argument that is not UTF-8), a NUL or a lone
    surrogate in JSON data: one line and exit code 2, not the driver's error."""
    started = kenning("start", "three_steps", "--app", APP, "--input", '{"value": 1}', url=database_url)
    instance_id = started.stdout.strip()
    not_utf8 = "c\udcff"  # the bytes b"c\xff" on the command line
    refused: list[tuple[str, ...]] = [
        ("instances", "list", "--where", f"customer={not_utf8}"),
        ("instances", "show", not_utf8),
        ("message", "send", instance_id, not_utf8),
        ("request", not_utf8, "go", "--timeout", "1"),
        ("start", "three_steps", "--app", APP, "--input", '{"value": 1}', "--instance-id", not_utf8),
    ]
    for args in refused:
        line = one_error_line(kenning(*args, url=database_url))
        assert "c\\udcff'" in line and "not UTF-8" in line, line
    for data, reason in (('{"a": "x\\u0000"}', "NUL"), ('{"a": "\\ud800"}', "surrogate")):
        for command in (("message", "send", instance_id, "go", "--data", data), ("request", instance_id, "go", data)):
            line = one_error_line(kenning(*command, url=database_url))
            assert reason in line and "cannot be stored" in line, line


def test_a_database_that_is_away_is_one_line_saying_to_try_again() -> None:
    """(issue 33, item 5) ``message send`` and ``request`` go through ``Client``: after its
    retries (5 s at the command) one line, exit code 1, that says to try again with the
    id that makes the message count once; not psycopg's error or a log line per retry."""
    down = "postgresql://nobody@127.0.0.1:1/x"
    for args, again in (
        (("message", "send", "i-1", "go", "--id", "m-1"), "message_id='m-1'"),
        (("request", "i-1", "go", "--id", "r-1"), "request_id='r-1'"),
    ):
        line = one_error_line(kenning(*args, url=down), code=1)
        assert "the database is unavailable" in line and f"try again with {again}" in line, line
