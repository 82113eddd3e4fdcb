"""``kenning up``: PostgreSQL (embedded unless ``KENNING_DATABASE_URL`` is set), migrations,
then ingress, workers, scheduler, relayer (and a local sink) as separate OS processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg

from kenning.app import App
from kenning.core.names import env_name
from kenning.core.urls import hide_credentials
from kenning.db.migrate import migrate
from kenning.hosting.appload import broker_url, database_url, load_app
from kenning.hosting.config import add_logging_options, add_option, port_number, positive_int
from kenning.hosting.embedded import embedded_postgres, with_database
from kenning_devtools.ports import free_ports
from kenning_devtools.up.claims import check_ports_free, data_dir_lock
from kenning_devtools.up.hints import hints
from kenning_devtools.up.supervisor import ChildSpec, Supervisor, wait_all_ready
from kenning_ingress.main import check_exposure
from kenning_ingress.settings import IngressSettings

EXAMPLE_APP = "kenning.examples.orders"  # shipped in the package: found from any install
CHILD_SHUTDOWN_GRACE = "10"  # seconds a child gets on SIGTERM (unless configured) ...
STOP_GRACE = 20.0  # ... well within the time ``up`` waits before SIGKILL


HELP = "run the whole stack locally (embedded PostgreSQL unless one is configured)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--database-url", default="", help="use this database instead of an embedded one")
    add_option(parser, "--app", default=EXAMPLE_APP, help="modules defining workflows (default: the order example)")
    # up's own meaning of these names (worker processes; the ingress it starts): KENNING_UP_*
    add_option(parser, "--workers", default=2, type=positive_int, help="worker processes", process="up")
    add_option(parser, "--port", default=8000, type=positive_int, help="ingress port", process="up")
    add_option(parser, "--host", default="127.0.0.1", help="ingress address", process="up")
    add_option(parser, "--ingress-token", default="", help="bearer token the ingress requires (prefer the env)")
    add_option(
        parser,
        "--ingress-allow-open",
        default=False,
        type=bool,
        help="let the ingress serve without a token on an address other than loopback (refused otherwise)",
    )
    add_option(parser, "--broker-url", default="", help="where the relayer publishes (default: a local sink)")
    add_option(parser, "--sink-port", default=9000, type=positive_int, help="port of the local sink")
    add_option(parser, "--console-port", default=8300, type=positive_int, help="port of the web console")
    add_option(
        parser,
        "--metrics-port",
        default=0,
        type=port_number,
        help="first of consecutive ports for the scheduler's, relayer's and workers' GET /metrics; 0: free ports",
        process="up",
    )
    add_option(parser, "--data-dir", default=".kenning", help="embedded database, logs and health files live here")
    add_logging_options(parser)


def say(line: str) -> None:
    sys.stdout.write(f"kenning up: {line}\n")
    sys.stdout.flush()


def _python_path() -> list[str]:
    """Where the children import the app from: the current directory and ``PYTHONPATH``."""
    return [os.getcwd(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]


def _check_app(app: str, python_path: list[str]) -> App:
    """Import the app once here: a typo fails now with exit code 2, not as every child
    crashing at start; and its workflows give the hints printed once the stack is ready."""
    saved = list(sys.path)
    sys.path[:0] = [p for p in python_path if p not in sys.path]
    try:
        return load_app(app)
    finally:
        sys.path[:] = saved


def _write_env_file(data_dir: Path, database_url: str, ingress_url: str) -> Path:
    """``source .kenning/env`` gives a second terminal what operator commands need."""
    path = data_dir / "env"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the URL may hold a password
    with os.fdopen(fd, "w") as out:
        out.write(f"export KENNING_DATABASE_URL={shlex.quote(database_url)}\n")
        out.write(f"export KENNING_INGRESS_URL={shlex.quote(ingress_url)}\n")
    return path


def _said_orphan(pid: int) -> None:
    say(f"postgres   stopped a server left running by an earlier run (pid {pid})")


@contextlib.contextmanager
def _database(args: argparse.Namespace, app: App, data_dir: Path) -> Iterator[str]:
    configured = database_url(args.database_url, app)
    if configured:
        say(f"postgres   using {'KENNING_DATABASE_URL' if args.database_url else 'the App db_url'}")
        yield configured
        return
    with contextlib.ExitStack() as stack:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR on import
            server = stack.enter_context(embedded_postgres(data_dir / "pgdata", on_orphan=_said_orphan))
        stack.callback(say, "postgres   stopped")
        with psycopg.connect(with_database(server, "postgres"), autocommit=True) as admin:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = 'kenning'").fetchone()
            if not exists:
                admin.execute("CREATE DATABASE kenning")
        say(f"postgres   ready (embedded, data in {data_dir / 'pgdata'})")
        yield with_database(server, "kenning")


def _public(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _metrics_ports(args: argparse.Namespace) -> dict[str, int]:
    """The metrics port of each child but the ingress (which serves ``/metrics`` itself):
    consecutive, from ``--metrics-port`` on or from a free run."""
    names = ["scheduler", "relayer", *(f"worker-{n}" for n in range(1, args.workers + 1))]
    first = args.metrics_port or free_ports(len(names))
    return {name: first + i for i, name in enumerate(names)}


def _metrics_urls(ingress_url: str, ports: dict[str, int]) -> list[str]:
    return [
        f"ingress {ingress_url}/metrics",
        *(f"{name} http://127.0.0.1:{port}/metrics" for name, port in ports.items()),
    ]


def _broker(args: argparse.Namespace, app: App) -> str:
    """Where the relayer publishes: the configured broker, else the local sink."""
    return broker_url(args.broker_url, app) or f"http://127.0.0.1:{args.sink_port}/"


def _children(args: argparse.Namespace, app: App, data_dir: Path, metrics: dict[str, int]) -> list[ChildSpec]:
    ingress_url = f"http://{_public(args.host)}:{args.port}"
    configured_broker = broker_url(args.broker_url, app)
    specs = [
        ChildSpec(
            "ingress",
            ["ingress", "--host", args.host, "--port", str(args.port)],
            ready_url=f"{ingress_url}/readyz",
            port=args.port,
            describe=f"POST CloudEvents to {ingress_url}/",
        ),
        *(
            ChildSpec(
                f"worker-{n}",
                [
                    "worker",
                    "--app",
                    args.app,
                    "--health-file",
                    str(data_dir / f"worker-{n}.ok"),
                    "--metrics-port",
                    str(metrics[f"worker-{n}"]),
                ],
                health_file=str(data_dir / f"worker-{n}.ok"),
            )
            for n in range(1, args.workers + 1)
        ),
        ChildSpec(
            "scheduler",
            [
                "scheduler",
                "--app",
                args.app,
                "--health-file",
                str(data_dir / "scheduler.ok"),
                "--metrics-port",
                str(metrics["scheduler"]),
            ],
            health_file=str(data_dir / "scheduler.ok"),
        ),
        ChildSpec(
            "console",
            ["console", "--app", args.app, "--host", "127.0.0.1", "--port", str(args.console_port)],
            ready_url=f"http://127.0.0.1:{args.console_port}/healthz",
            port=args.console_port,
            describe=f"the web console at http://127.0.0.1:{args.console_port}/",
        ),
        ChildSpec(
            "relayer",
            [
                "relayer",  # its --broker-url comes in the environment: a command line is anyone's to read
                "--health-file",
                str(data_dir / "relayer.ok"),
                "--metrics-port",
                str(metrics["relayer"]),
            ],
            health_file=str(data_dir / "relayer.ok"),
            describe=f"publishing to {hide_credentials(_broker(args, app))}",
        ),
    ]
    if not configured_broker:
        specs.insert(
            0,
            ChildSpec(
                "sink",
                ["sink", "--sink-port", str(args.sink_port)],
                ready_url=f"http://127.0.0.1:{args.sink_port}/healthz",
                port=args.sink_port,
                describe=f"logs relayed events (log: {data_dir / 'logs' / 'sink.log'})",
            ),
        )
    return specs


async def _serve(args: argparse.Namespace, app: App, database_url: str, data_dir: Path, python_path: list[str]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = {
        **os.environ,
        "KENNING_DATABASE_URL": database_url,
        "KENNING_MIGRATE": "false",
        "KENNING_LOG_FORMAT": "json",
        "PYTHONPATH": os.pathsep.join(python_path),
    }
    env.setdefault(env_name("--shutdown-grace-seconds", "worker"), CHILD_SHUTDOWN_GRACE)
    env[env_name("--broker-url")] = _broker(args, app)
    if args.ingress_token:
        env["KENNING_INGRESS_TOKEN"] = args.ingress_token
    if args.ingress_allow_open:
        env["KENNING_INGRESS_ALLOW_OPEN"] = "true"
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ingress = f"http://{_public(args.host)}:{args.port}"
    env_file = _write_env_file(data_dir, database_url, ingress)
    supervisor = Supervisor(env, logs, say)
    metrics = _metrics_ports(args)
    for spec in _children(args, app, data_dir, metrics):
        supervisor.start(spec)
    watcher = asyncio.create_task(supervisor.watch(stop))
    watcher.add_done_callback(lambda _: stop.set())  # a supervisor that broke stops everything
    try:
        if await wait_all_ready(supervisor, timeout=120, stop=stop):
            say(f"all {len(supervisor.children)} processes ready; Ctrl-C stops everything")
            say(f"ingress    {ingress}/   GET /instances/<id>, POST /cancel/<id>")
            say(f"console    http://127.0.0.1:{args.console_port}/   instances, their histories, events")
            say(f"metrics    {', '.join(_metrics_urls(ingress, metrics))}")
            say(f"operator   source {env_file}   then: kenning instances list   (docs/quickstart.md)")
            for n, command in enumerate(hints(app) or [f"(--app {args.app} defines no workflows)"]):
                say(f"{'try' if n == 0 else '':<10} {command}")
        elif not stop.is_set():
            waiting = ", ".join(c.spec.name for c in supervisor.children if not c.ready)
            say(f"not ready after 120 s: {waiting} (see {logs})")
        await stop.wait()
    finally:
        say("stopping")
        await supervisor.stop_all(grace=STOP_GRACE)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher  # re-raises if the supervisor itself failed
    if supervisor.failure is not None:  # a child that cannot start: as uvicorn, compose
        sys.stderr.write(f"kenning up: {supervisor.failure}\n")
        return 1
    return 0


def _servers(args: argparse.Namespace, app: App) -> dict[str, tuple[str, int]]:
    """The ports of the servers up starts at fixed addresses (``check_ports_free``)."""
    servers = {
        "the ingress, --port": (args.host, args.port),
        "the web console, --console-port": ("127.0.0.1", args.console_port),
    }
    if not broker_url(args.broker_url, app):
        servers["the local sink, --sink-port"] = ("127.0.0.1", args.sink_port)
    return servers


def run(args: argparse.Namespace) -> int:
    # the ingress's own rule, checked before anything starts
    ingress = IngressSettings(host=args.host, ingress_token=args.ingress_token, allow_open=args.ingress_allow_open)
    check_exposure(ingress)
    python_path = _python_path()
    app = _check_app(args.app, python_path)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with data_dir_lock(data_dir):  # a second up here: refused, before it touches the first one's files
        check_ports_free(_servers(args, app))  # another stack's ports: refused before anything starts
        with _database(args, app, data_dir) as url:
            revision = migrate(url)
            say(f"migrate    schema at revision {revision}")
            return asyncio.run(_serve(args, app, url, data_dir, python_path))
