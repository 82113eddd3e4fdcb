"""Kenning as a library in someone's program (issue 25, item 9): it prints nothing on
stdout, and below warning nothing at all, unless the program configured logging; a
program that configured structlog or the standard library's logging gets Kenning's lines
its way. Before, structlog's defaults printed Kenning's debug lines on stdout, into the
output of a program that prints JSON for another to read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT

# starts a workflow by name (no worker needed), reads its status, prints JSON
BODY = """\
import asyncio
import json
import os

import kenning
{configure}

async def main() -> None:
    async with kenning.Client(os.environ["KENNING_DATABASE_URL"]) as client:
        started = await client.start("library_logging_example", value=1)
        row = await client.status(started.instance_id)
    print(json.dumps({{"status": row.status}}))


asyncio.run(main())
"""

STDLIB_DEBUG = """
import logging

logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
logging.getLogger("asyncio").setLevel(logging.WARNING)
"""

# configured after importing kenning, as a program's main() would
STRUCTLOG_JSON = """
import sys

import structlog

structlog.configure(
    processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
    logger_factory=structlog.PrintLoggerFactory(sys.stderr),
)
"""


def _run(tmp_path: Path, database_url: str, configure: str = "") -> tuple[str, str]:
    program = tmp_path / "program.py"
    program.write_text(BODY.format(configure=configure))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, str(program)],
        env={**env, "KENNING_DATABASE_URL": database_url},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_a_program_using_a_client_has_nothing_of_kenning_on_stdout_or_stderr(database_url: str, tmp_path: Path) -> None:
    stdout, stderr = _run(tmp_path, database_url)
    assert json.loads(stdout) == {"status": "pending"}, stdout
    assert stdout == '{"status": "pending"}\n'
    assert stderr == ""


def test_a_program_that_configured_logging_gets_kenning_lines_there(database_url: str, tmp_path: Path) -> None:
    stdout, stderr = _run(tmp_path, database_url, STDLIB_DEBUG)
    assert stdout == '{"status": "pending"}\n'
    # the first connection's debug line, through the program's handler, named as Kenning's logger
    line = next(line for line in stderr.splitlines() if "database.mode" in line)
    assert line.startswith("kenning.db DEBUG event=database.mode ")
    assert "pooler=false" in line and "prepared_statements=true" in line


def test_a_program_that_configured_structlog_gets_kenning_lines_its_way(database_url: str, tmp_path: Path) -> None:
    stdout, stderr = _run(tmp_path, database_url, STRUCTLOG_JSON)
    assert stdout == '{"status": "pending"}\n'
    records = [json.loads(line) for line in stderr.splitlines()]
    assert {"event": "database.mode", "level": "debug"}.items() <= next(
        r for r in records if r["event"] == "database.mode"
    ).items()
