"""The console's escape-hatch pages and an instance's standing with payload encryption on
(``KENNING_ENCRYPTION_KEYS``): a compensation's last error, the instance's error on the
action pages and ``kenning why``'s lines on the instance page are opened with the
console's key and read "encrypted" without it, never the sealed envelope as stored."""

from __future__ import annotations

import base64
import html
import re

import httpx
import psycopg

from kenning import codecs
from kenning.client import Client
from tests.console_support import became, console_ready, instance_status, spawn_console
from tests.logguard import expect_log
from tests.support import ProcessPool, eventually, executions, kenning_command

APP = "tests.apps.console_day"
K1 = "k1:" + base64.b64encode(b"\x01" * 32).decode()
REFUSED = "the bank refuses the refund"

Sql = psycopg.Connection[tuple[object, ...]]


def _why(page: str) -> str:
    """The instance page's ``kenning why`` lines, as text."""
    found = re.search(r"<details data-why>(.*?)</details>", page, re.S)
    assert found is not None, page
    return html.unescape(found[1])


async def test_sealed_errors_read_as_the_console_reads_payloads(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str
) -> None:
    expect_log("instance.failed", workflow="day.compensated")  # the card is declined on purpose
    expect_log("instance.failed", workflow="day.refused_saga")  # it fails for good, then compensates
    processes.worker(database_url, APP, env={codecs.KEYS_VARIABLE: K1})
    async with Client(database_url) as client:
        await client.start("day.stuck_saga", instance_id="s-1", order_id="o-3")
        await client.start("day.refused_saga", instance_id="r-1", order_id="o-5")
        await client.start("day.compensated", instance_id="c-1", order_id="o-4")
    await became(sql, "s-1", "waiting_for_event")
    await became(sql, "c-1", "failed")
    cancelled = kenning_command("instances", "cancel", "s-1", url=database_url)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    for instance_id in ("s-1", "r-1"):
        refunds = f"refund {instance_id}"
        await eventually(lambda: executions(side_channel)[refunds] >= 2, timeout=20, message="the refund fails")  # noqa: B023
        assert instance_status(sql, instance_id) == "compensating"
    stored = sql.execute("SELECT attempts::text FROM kenning_instances WHERE id = 's-1'").fetchone()
    assert stored is not None and '"$enc"' in str(stored[0]) and "refuses" not in str(stored[0])  # sealed

    for keys, expected in ((K1, REFUSED), ("", codecs.ENCRYPTED)):
        url, console = spawn_console(processes, database_url, app=APP, env={codecs.KEYS_VARIABLE: keys})
        await console_ready(url, console)
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            skip = (await http.get("/instances/s-1/skip-compensation")).text
            shown_error = f"RuntimeError(&#39;{REFUSED}&#39;)" if keys else expected
            assert f"last error: {shown_error}" in skip, skip
            assert "$enc" not in skip, skip

            # the instance's own error, on the pages that ask before an action
            for path in ("/instances/r-1/skip-compensation", "/instances/c-1/skip-compensation"):
                asked = (await http.get(path)).text
                assert "$enc" not in asked, asked
            refused = (await http.get("/instances/r-1/skip-compensation")).text
            assert ("the order o-5 was refused" if keys else f"<dd>{codecs.ENCRYPTED}</dd>") in refused

            # kenning why's lines on a compensating instance's page: its error and the retried one
            why = _why((await http.get("/instances/r-1")).text)
            assert "$enc" not in why, why
            assert "the order o-5 was refused" in why if keys else f"TerminalError: {codecs.ENCRYPTED}" in why
            assert expected in why
        console.terminate()
