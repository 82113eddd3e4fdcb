"""A primary that takes connections and answers reads but never finishes a commit (its
synchronous standby gone): every process says so within seconds, and all of it goes on
once commits complete again, with no restart and nothing lost.

The fault is PostgreSQL's own: ``synchronous_standby_names`` set to a standby that never
connects makes every commit that wrote something wait for it, forever; reads, connects
and the statements before a commit still work. Set and cleared with ``ALTER SYSTEM`` and
a reload, on a cluster of this test's own (the machine's server is shared).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import psycopg

from kenning import Client
from kenning.db import connect
from kenning.db.migrate import migrate
from tests.chaos_postgres import owned_postgres
from tests.console_support import spawn_console
from tests.ingress_support import start_ingress
from tests.logguard import expect_log
from tests.metrics_support import scrape, value
from tests.relayer_support import relayer_process, start_receiver
from tests.scheduler_support import TIMER_APP, spawn_scheduler
from tests.support import ProcessPool, eventually, executions, free_port, kenning_command, workers_started

STALL_SECONDS = "1.5"  # KENNING_COMMIT_STALL_SECONDS here: the default is 5 s
DEADLINE = 30.0  # seconds for every process to tell, and again to recover


def stall_commits(url: str, standby: str | None) -> None:
    """Make every commit wait for ``standby`` (one that never connects), or, with None,
    for none again."""
    with psycopg.connect(url, autocommit=True) as admin:
        if standby is None:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'")
        admin.execute("SELECT pg_reload_conf()")


def readiness(urls: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Each process's ``GET /readyz``: its status code and body (0: no answer)."""
    answers: dict[str, tuple[int, str]] = {}
    for name, url in urls.items():
        try:
            response = httpx.get(url, timeout=3)
            answers[name] = (response.status_code, response.text)
        except httpx.HTTPError as error:
            answers[name] = (0, repr(error))
    return answers


def unready_everywhere(urls: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Every ``/readyz`` answer, once all of them are 503; else nothing."""
    answers = readiness(urls)
    return answers if all(code == 503 for code, _ in answers.values()) else {}


def status_of(url: str, instance_id: str) -> str:
    with psycopg.connect(url) as sql:
        row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return str(row[0]) if row else ""


async def test_commits_that_never_complete_fail_readiness_everywhere_and_are_named(
    processes: ProcessPool, side_channel: str, tmp_path: Path
) -> None:
    with owned_postgres(tmp_path / "pg") as pg:
        migrate(pg.url)
        env = {"KENNING_TEST_SIDE_CHANNEL": side_channel, "KENNING_COMMIT_STALL_SECONDS": STALL_SECONDS}
        worker_port, scheduler_port, relayer_port = free_port(), free_port(), free_port()
        worker = processes.worker(pg.url, TIMER_APP, "--metrics-port", str(worker_port), env=env)
        scheduler = spawn_scheduler(processes, pg.url, "--metrics-port", str(scheduler_port), env=env)
        receiver = await start_receiver(processes)
        relayer = relayer_process(processes, pg.url, receiver.url, "--metrics-port", str(relayer_port), env=env)
        ingress = start_ingress(processes, pg.url, "--workers", "2", env=env)  # readyz: either answers
        console_url, console = spawn_console(processes, pg.url, env=env)
        kenning_processes = [worker, scheduler, relayer, ingress.process, console]
        urls = {
            "worker": f"http://127.0.0.1:{worker_port}/readyz",
            "scheduler": f"http://127.0.0.1:{scheduler_port}/readyz",
            "relayer": f"http://127.0.0.1:{relayer_port}/readyz",
            "ingress": f"{ingress.url}/readyz",
            "console": f"{console_url}/readyz",
        }
        await workers_started(processes, [worker])
        await eventually(
            lambda: all(code == 200 for code, _ in readiness(urls).values()),
            timeout=DEADLINE,
            message="every process ready",
        )
        database = connect(pg.url, pool_size=1, max_overflow=0)
        try:
            async with Client(database=database) as client:
                instance_id = (await client.start("nap", seconds=2.0)).instance_id
        finally:
            await database.dispose()
        await eventually(lambda: status_of(pg.url, instance_id) == "waiting_for_timer", message="napping")

        stall_commits(pg.url, "ghost")
        expect_log("database.commits_stalled")
        try:
            answers = await eventually(
                lambda: unready_everywhere(urls),
                timeout=DEADLINE,
                interval=0.2,
                message="every readyz fails",
            )
            await stalled_everywhere(processes, kenning_processes, answers, urls, instance_id, pg.url)
        finally:
            stall_commits(pg.url, None)
        await eventually(
            lambda: all(code == 200 for code, _ in readiness(urls).values()),
            timeout=DEADLINE,
            interval=0.2,
            message="every process ready again",
        )
        await eventually(lambda: status_of(pg.url, instance_id) == "completed", timeout=DEADLINE, message="done")
        assert executions(side_channel)[f"woke:nap {instance_id}"] == 1
        await eventually(
            lambda: all('"database.commits_resumed"' in processes.log_of(p) for p in kenning_processes),
            message="each process logged the recovery",
        )
        processes.stop_all()


async def stalled_everywhere(
    processes: ProcessPool,
    kenning_processes: list[psutil.Popen],
    answers: dict[str, tuple[int, str]],
    ready_urls: dict[str, str],
    instance_id: str,
    url: str,
) -> None:
    """What the stall looks like from outside: each readyz names it, each process logged
    it, the gauge shows it, ``kenning why`` explains the instance it holds up."""
    assert all("commits not completing" in body for _, body in answers.values()), answers
    await eventually(
        lambda: all('"database.commits_stalled"' in processes.log_of(p) for p in kenning_processes),
        message="each process logged the stall",
    )
    for name, ready_url in ready_urls.items():
        metrics_url = ready_url.removesuffix("/readyz") + "/metrics"
        assert value(await scrape(metrics_url), "kenning_commit_stall_seconds") > 0, name
    why = kenning_command("why", instance_id, "--commit-stall-seconds", STALL_SECONDS, url=url)
    assert why.returncode == 0, why.stderr
    assert "NOT NOW: commits are not completing" in why.stdout, why.stdout
    assert "wait for a synchronous standby" in why.stdout and "'ghost', none connected" in why.stdout, why.stdout
