"""``--source URL`` forms the ingress refuses, and credentials kept out of its output: a
malformed URL is one line and exit code 2 (never a traceback, never the password), and a
NATS token (``nats://TOKEN@host``) is hidden in the log lines naming the source."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.sources_support import log_events, start_consuming_ingress
from tests.support import REPO_ROOT, ProcessPool, eventually, free_port

SECRET = "S3CRETpw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"amqp://u:{SECRET}@[::1/x?queue=q", "source 'amqp://***' is invalid: Invalid IPv6 URL"),
        (f"nats://{SECRET}@127.0.0.1:4222?stream=s", "source 'nats://***@127.0.0.1:4222?stream=s' needs ?consumer="),
    ],
)
def test_a_bad_source_url_is_one_line_and_exit_code_2_without_its_secret(url: str, shown: str) -> None:
    env = {**os.environ, "KENNING_DATABASE_URL": "postgresql://kenning@127.0.0.1:1/kenning"}
    done = subprocess.run(
        [sys.executable, "-m", "kenning", "ingress", "--no-migrate", "--source", url],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and shown in done.stderr, done.stderr
    assert SECRET not in done.stderr


async def test_a_nats_token_is_hidden_in_the_ingress_log(processes: ProcessPool, database_url: str) -> None:
    # a server that is down: the source reports it (with its name) and tries again
    url = f"nats://{SECRET}@127.0.0.1:{free_port()}?stream=S&consumer=c"
    ingress = start_consuming_ingress(processes, database_url, url)

    def reported() -> list[dict[str, object]]:
        return log_events(processes, ingress.process, "source.disconnected") + log_events(
            processes, ingress.process, "source.broker_error"
        )

    lines: list[dict[str, object]] = await eventually(reported, timeout=30, message="the source reports the server")
    assert lines[0]["source"] == f"nats://***@127.0.0.1:{url.split(':')[2].split('?')[0]}?stream=S&consumer=c"
    assert SECRET not in processes.log_of(ingress.process)
