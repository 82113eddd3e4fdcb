"""Secrets kept out of everything a process shows (issue 25, item 8): every URL and
conninfo form the drivers accept, with a distinct secret in each, given to the real
processes that read them (``kenning migrate``, ``kenning ingress`` and its sources, a
worker, the relayer, ``kenning up``); then every line they printed or logged, every
refusal and every ``/metrics`` they serve is searched for every secret.

A secret is made of marker words joined by the characters that split it (a raw ``/``,
``?``, ``#``, ``:`` or ``@``): a driver that misreads the URL may show one piece of it (in
a host name, a port, a label), so each word is searched for on its own."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psutil

from kenning.db import Database
from tests import logguard
from tests.brokers import AMQP_URL, NATS_URL, jetstream_stream, nats_connection, require_nats, require_rabbitmq
from tests.relayer_support import insert_events
from tests.sources_support import log_events, start_consuming_ingress
from tests.support import ProcessPool, eventually, free_port, free_ports, run_kenning

STRUCTURED = "application/cloudevents+json"


class Secrets:
    """Marker words, each unique to this test run, and where they were found."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:6]
        self.words: list[str] = []

    def word(self, name: str) -> str:
        word = f"Sx{name}{self.run}"
        self.words.append(word)
        return word

    def leaks(self, texts: dict[str, str]) -> list[str]:
        return [
            f"{word} in {where}: {line.strip()[:300]}"
            for where, text in texts.items()
            for line in text.splitlines()
            for word in self.words
            if word in line
        ]


def with_password(database_url: str, password: str, *, raw: bool = True) -> str:
    """``database_url`` with ``password`` in its authority (raw, or percent-encoded)."""
    parts = urlsplit(database_url)
    host = parts.netloc.rpartition("@")[2]
    secret = password if raw else quote(password, safe="")
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:{secret}@{host}"))


def with_query(database_url: str, query: str) -> str:
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(query="&".join(p for p in (parts.query, query) if p)))


def conninfo(database_url: str, password: str) -> str:
    parts = urlsplit(database_url)
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"host={parts.hostname or '127.0.0.1'} port={parts.port or 5432} user={parts.username or 'postgres'} "
        f"password='{quoted}' dbname={parts.path.lstrip('/')}"
    )


def on_port(url: str, port: int) -> str:
    """``url`` (a broker's, no credentials) with its host and port replaced."""
    return urlunsplit(urlsplit(url)._replace(netloc=f"127.0.0.1:{port}"))


def with_credentials(url: str, credentials: str, **query: str) -> str:
    parts = urlsplit(url)
    netloc = f"{credentials}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(f"{k}={v}" for k, v in query.items())))


def raw_metrics(url: str) -> str:
    try:
        response = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return ""
    return response.text if response.status_code == 200 else ""


async def answering_metrics(url: str, process: psutil.Popen, what: str) -> str:
    def scraped() -> str:
        assert process.poll() is None, f"{what} exited with {process.returncode}"
        return raw_metrics(url)

    return await eventually(scraped, timeout=60, interval=0.1, message=f"{what} serves {url}")


def logged(processes: ProcessPool, process: psutil.Popen, *events: str) -> bool:
    return all(log_events(processes, process, event) for event in events)


def refusals(runs: dict[str, list[str]], env: dict[str, str]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each command (``kenning ARGS``) run to its end, side by side."""
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        done = pool.map(lambda args: run_kenning(args, env), runs.values())
        return dict(zip(runs, done, strict=True))


async def test_no_process_logs_refuses_with_or_serves_a_secret(
    processes: ProcessPool, database: Database, database_url: str, empty_database_url: str
) -> None:
    require_rabbitmq()
    require_nats()
    secrets = Secrets()
    w = secrets.word
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_")}
    texts: dict[str, str] = {}

    # the database: a password holding raw "?", "#" and ":" (libpq and SQLAlchemy take it)
    # serves every process that runs; trust authentication accepts any password
    secret_database = with_password(database_url, f"{w('DbQ')}?{w('DbHash')}#{w('DbColon')}:{w('DbEnd')}")
    # kenning migrate: each form of the database's secret, run or refused
    migrations = refusals(
        {
            "raw ?#:": [
                "migrate",
                "--database-url",
                with_password(empty_database_url, f"{w('MigQ')}?{w('MigHash')}#x"),
            ],
            "?password=": [
                "migrate",
                "--database-url",
                with_query(empty_database_url, f"password={w('QueryPw')}&sslpassword={w('SslPw')}"),
            ],
            "conninfo": ["migrate", "--database-url", conninfo(empty_database_url, f"{w('Conn')} {w('Info')}'x")],
            "raw @": ["migrate", "--database-url", with_password(empty_database_url, f"{w('AtA')}@{w('AtB')}")],
            "raw /": ["migrate", "--database-url", with_password(empty_database_url, f"{w('SlashA')}/{w('SlashB')}")],
        },
        env,
    )
    for form, done in migrations.items():
        texts[f"kenning migrate ({form})"] = done.stdout + done.stderr
    async with jetstream_stream() as stream:
        # the ingress: the database above, and four sources: one consuming (NATS, a user
        # and a password with raw characters, encoded), an AMQP one whose password holds a
        # raw "/" after digits (urllib reads "guest:1234" as host and port: it connects
        # nowhere and says so), one with a wrong password (refused), a NATS token on a
        # server that is down
        consuming = with_credentials(
            NATS_URL,
            f"natsuser:{quote(w('NatsA') + '/?#@' + w('NatsB'), safe='')}",
            stream=stream.name,
            consumer="kenning",
        )
        misread = with_credentials(AMQP_URL, f"guest:1234/{w('AmqpSlash')}", queue="q")
        refused = with_credentials(AMQP_URL, f"guest:{w('AmqpWrong')}", queue="q")
        token = with_credentials(on_port(NATS_URL, free_port()), w("NatsToken"), stream="S", consumer="c")
        ingress = start_consuming_ingress(processes, secret_database, consuming, misread, refused, token, env=env)
        await eventually(
            lambda: (
                len(log_events(processes, ingress.process, "source.consuming")) >= 1
                and len(log_events(processes, ingress.process, "source.disconnected")) >= 3
            ),
            timeout=60,
            message="the NATS source consumes, the other three reported their failures",
        )
        async with nats_connection(stream.url) as client:
            event = {"specversion": "1.0", "type": "secrets.checked", "source": "tests", "id": "s-1", "data": {}}
            await client.jetstream().publish(
                stream.subject("in"), json.dumps(event).encode(), headers={"Content-Type": STRUCTURED}
            )
        # the source's label appears with its first message
        await eventually(
            lambda: "kenning_source_messages_total{" in raw_metrics(f"{ingress.url}/metrics"),
            timeout=30,
            message="the NATS source stored its message",
        )
        texts["ingress /metrics"] = raw_metrics(f"{ingress.url}/metrics")
        assert 'source="nats://natsuser:***@' in texts["ingress /metrics"], texts["ingress /metrics"]

    # the ingress refuses a source it cannot read, in one line
    sources = refusals(
        {
            "raw ?": [
                "ingress",
                "--no-migrate",
                "--source",
                with_credentials(AMQP_URL, f"guest:ab?{w('SrcQ')}", queue="q"),
            ],
            "raw #": [
                "ingress",
                "--no-migrate",
                "--source",
                with_credentials(AMQP_URL, f"guest:{w('SrcHash')}#x", queue="q"),
            ],
            "?token=": ["ingress", "--no-migrate", "--source", f"{NATS_URL}?stream=s&consumer=c&token={w('SrcToken')}"],
        },
        {**env, "KENNING_DATABASE_URL": secret_database},
    )
    for form, done in sources.items():
        texts[f"kenning ingress --source ({form})"] = done.stdout + done.stderr

    # a worker and a relayer whose password RabbitMQ refuses (holding raw characters,
    # encoded), each with its /metrics; the relayer connects for the event waiting
    await insert_events(database, 1)
    worker_port = free_ports(2)
    relayer_port = worker_port + 1
    worker = processes.worker(secret_database, "tests.apps.core", "--metrics-port", str(worker_port), env=env)
    rabbit = urlsplit(AMQP_URL).netloc.rpartition("@")[2]
    relayer = processes.spawn(
        ["relayer", "--no-migrate", "--metrics-port", str(relayer_port)],
        env={
            **env,
            "KENNING_DATABASE_URL": secret_database,
            "KENNING_BROKER_URL": f"amqp://guest:{quote(w('RelayA') + '/?#@' + w('RelayB'), safe='')}@{rabbit}/",
        },
        name="relayer",
    )
    brokers = refusals(
        {
            "raw /": [
                "relayer",
                "--no-migrate",
                "--broker-url",
                with_credentials(AMQP_URL, f"guest:ab/{w('BrokerSlash')}", exchange="x"),
            ],
            "?token=": ["relayer", "--no-migrate", "--broker-url", f"{NATS_URL}?subject=s&token={w('BrokerToken')}"],
        },
        {**env, "KENNING_DATABASE_URL": secret_database},
    )
    for form, done in brokers.items():
        texts[f"kenning relayer --broker-url ({form})"] = done.stdout + done.stderr
    for name, port, process in (("worker", worker_port, worker), ("relayer", relayer_port, relayer)):
        texts[f"{name} /metrics"] = await answering_metrics(f"http://127.0.0.1:{port}/metrics", process, name)
    await eventually(lambda: logged(processes, worker, "worker.started"), timeout=30, message="the worker started")
    await eventually(
        lambda: logged(processes, relayer, "relayer.broker_unreachable", "outbox.retry_scheduled"),
        timeout=30,
        message="RabbitMQ refused the relayer's password",
    )

    processes.stop_all()  # every line written, the last ones on the way out included
    for _process, path in processes.procs:
        texts[path.stem] = path.read_text(errors="replace")
    leaks = secrets.leaks(texts)
    assert not leaks, "secrets shown:\n" + "\n".join(leaks)
    # what ran and what was refused (one line, exit code 2)
    codes = {form: done.returncode for form, done in migrations.items()}
    # a raw @ is misread, and so refused, where a host follows it in the authority; a
    # socket URL (the embedded PostgreSQL: host in the query) leaves libpq nothing to
    # misread, and the migration runs (its secret unshown all the same)
    raw_at = 2 if urlsplit(empty_database_url).hostname else 0
    assert codes == {"raw ?#:": 0, "?password=": 0, "conninfo": 2, "raw @": raw_at, "raw /": 2}, migrations
    assert {done.returncode for done in (*sources.values(), *brokers.values())} == {2}, (sources, brokers)


async def test_kenning_up_prints_logs_and_serves_no_secret(database_url: str, tmp_path: Path) -> None:
    """``kenning up`` on a configured database and broker: what it prints, its children's
    logs and every /metrics it lists; the broker URL travels to the relayer in its
    environment, not on a command line any local user can read."""
    require_nats()
    secrets = Secrets()
    w = secrets.word
    broker = with_credentials(
        NATS_URL, f"natsuser:{quote(w('UpA') + '/?#@' + w('UpB'), safe='')}", subject="kenning.{type}"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_") and k != "PYTHONPATH"}
    env["KENNING_DATABASE_URL"] = with_password(database_url, f"{w('UpDbQ')}?{w('UpDbHash')}#{w('UpDbColon')}:x")
    port, console_port = free_port(), free_port()
    data_dir = tmp_path / ".kenning"
    stdout_path, stderr_path = tmp_path / "up.stdout", tmp_path / "up.stderr"
    args = ["up", "--workers", "1", "--port", str(port), "--console-port", str(console_port)]
    args += ["--metrics-port", str(free_ports(3)), "--broker-url", broker, "--data-dir", str(data_dir)]
    guard = logguard.current()
    assert guard is not None
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        up = psutil.Popen(
            [sys.executable, "-m", "kenning", *args],
            env=env,
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    guard.watch_file("kenning up", stdout_path)
    guard.watch_file("kenning up (stderr)", stderr_path)
    try:

        def ready() -> bool:
            assert up.poll() is None, f"kenning up exited: {stdout_path.read_text()}{stderr_path.read_text()}"
            return "processes ready" in stdout_path.read_text()

        await eventually(ready, timeout=120, interval=0.1, message="kenning up is ready")
        relayer = next(c for c in up.children(recursive=True) if "relayer" in c.cmdline())
        texts = {"the relayer's command line": " ".join(relayer.cmdline())}
        (metrics_line,) = (line for line in stdout_path.read_text().splitlines() if "/metrics" in line)
        scraped = {url: raw_metrics(url) for url in re.findall(r"http://\S+/metrics", metrics_line)}
        assert all(scraped.values()) and len(scraped) == 4, scraped  # the ingress, scheduler, relayer, worker
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    logs = {f"up {path.stem}": path.read_text(errors="replace") for path in (data_dir / "logs").glob("*.log")}
    for name, text in logs.items():
        guard.watch_text(name, text)
    printed = stdout_path.read_text()
    texts.update({"kenning up": printed + stderr_path.read_text(), **logs, **scraped})
    leaks = secrets.leaks(texts)
    assert not leaks, "secrets shown:\n" + "\n".join(leaks)
    assert "publishing to nats://natsuser:***@" in printed, printed
