"""A PostgreSQL pair managed by pg_auto_failover (Debian's ``pg-auto-failover-cli`` and
``postgresql-<version>-auto-failover``), for the failover test and ``kenning bench
--sections failover``: a monitor and two nodes, a primary and a synchronous standby, each
``pg_autoctl`` in a process group of its own, so killing a node kills its PostgreSQL too
(a lost machine), and the monitor promotes the standby.

The monitor's health checks are tightened (a check a second, a node unhealthy after 3 s
without one) so a failover takes seconds, not the defaults' half a minute; those settings
are the manager's, not Kenning's, and the bound Kenning states is from the promotion on.
PostgreSQL refuses to run as root: as root, everything runs as the ``postgres`` user."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

# the monitor's pgautofailover.* settings, in milliseconds (see the module's docstring)
MONITOR_SETTINGS = {
    "health_check_period": 1000,
    "health_check_timeout": 1000,
    "health_check_max_retries": 1,
    "health_check_retry_delay": 500,
    "node_considered_unhealthy_timeout": 3000,
    "primary_demote_timeout": 3000,
}
# the states in which a node takes writes
WRITABLE_STATES = ("single", "wait_primary", "primary")


def pg_autoctl() -> str | None:
    return shutil.which("pg_autoctl")


def postgres_bin() -> Path | None:
    """The binaries of the newest PostgreSQL that has the pg_auto_failover extension."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/lib/pgautofailover.so"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent.parent / "bin" if found else None


def missing() -> str | None:
    """Why a formation cannot start here, or None."""
    if pg_autoctl() is None or postgres_bin() is None:
        return "pg_auto_failover is not installed (apt-get install pg-auto-failover-cli postgresql-15-auto-failover)"
    if os.geteuid() == 0 and _system_user() is None:
        return "running as root without a 'postgres' system user to run PostgreSQL as"
    return None


def _system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return None


@dataclass
class Node:
    name: str
    port: int
    process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


@dataclass
class Formation:
    """A monitor and two nodes on the given ports of 127.0.0.1, data under ``root``."""

    root: Path
    monitor_port: int
    node_ports: tuple[int, int]
    database: str = "kenning"
    nodes: list[Node] = field(init=False)
    _monitor: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _killed: subprocess.Popen[bytes] | None = field(init=False, default=None)  # exits on purpose

    def __post_init__(self) -> None:
        self.nodes = [Node(f"node_{n + 1}", port) for n, port in enumerate(self.node_ports)]

    # ------------------------------------------------------------------ addresses

    @property
    def monitor_url(self) -> str:
        return f"postgresql://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    @property
    def multi_host_url(self) -> str:
        """libpq's way to the primary, whichever node it is (``pg_autoctl show uri``'s form)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write&connect_timeout=2"

    # ------------------------------------------------------------------ running

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        binary = pg_autoctl()
        assert binary is not None
        env = {
            "PATH": f"{postgres_bin()}:/usr/bin:/bin",
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "state"),
            "PG_CONFIG": str(postgres_bin() / "pg_config"),  # type: ignore[operator]
            # pg_autoctl's initdb takes the locale from here: without one its databases
            # are SQL_ASCII, which kenning migrate refuses (Kenning needs UTF8)
            "LANG": "C.UTF-8",
        }
        with open(self.root / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [binary, *args],
                env=env,
                cwd=self.root,
                user=_system_user(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its PostgreSQL in its process group: killed with it
            )

    def _common(self, name: str, port: int) -> list[str]:
        return ["--pgdata", str(self.root / name), "--pgport", str(port), "--hostname", "127.0.0.1",
                "--auth", "trust", "--no-ssl", "--run"]  # fmt: skip

    def start(self, timeout: float = 120) -> None:
        """The monitor, the first node (the primary), then the second (its synchronous
        standby); returns when the monitor reports them primary and secondary."""
        deadline = time.monotonic() + timeout
        self._monitor = self._spawn("monitor", "create", "monitor", *self._common("monitor", self.monitor_port))
        self._until(lambda: self._answers(self.monitor_url), deadline, "the monitor answers")
        with psycopg.connect(self.monitor_url.replace("autoctl_node@", "postgres@"), autocommit=True) as monitor:
            for name, value in MONITOR_SETTINGS.items():
                monitor.execute(f"ALTER SYSTEM SET pgautofailover.{name} = {int(value)}")
            monitor.execute("SELECT pg_reload_conf()")
        first, second = self.nodes
        first.process = self._spawn_node(first)
        self._until(lambda: self._writable(first), deadline, f"{first.name} takes writes")
        with psycopg.connect(first.url("postgres"), autocommit=True) as primary:
            # pg_autoctl's base backup of the standby waits for a checkpoint spread over
            # minutes; no spreading makes it immediate
            primary.execute("ALTER SYSTEM SET checkpoint_completion_target = 0")
            primary.execute("SELECT pg_reload_conf()")
        second.process = self._spawn_node(second)
        self._until(lambda: self.states() == {first.port: "primary", second.port: "secondary"}, deadline, "in sync")

    def _spawn_node(self, node: Node) -> subprocess.Popen[bytes]:
        return self._spawn(
            node.name,
            "create", "postgres", *self._common(node.name, node.port),
            "--monitor", f"{self.monitor_url}?sslmode=prefer", "--dbname", self.database, "--name", node.name,
        )  # fmt: skip

    def _until(self, condition: object, deadline: float, what: str) -> None:
        assert callable(condition)
        while not condition():
            for name, process in [("monitor", self._monitor), *((n.name, n.process) for n in self.nodes)]:
                if process is not None and process.poll() is not None and process is not self._killed:
                    raise RuntimeError(f"pg_autoctl ({name}) exited {process.returncode}: {self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pg_auto_failover: not {what} in time; states {self.states()}")
            time.sleep(0.05)

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _writable(self, node: Node) -> bool:
        try:
            with psycopg.connect(node.url(self.database), connect_timeout=2, autocommit=True) as conn:
                return conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
        except psycopg.OperationalError:
            return False

    def states(self) -> dict[int, str]:
        """Each node's reported state, by port, as the monitor has it ({} if it cannot tell)."""
        try:
            with psycopg.connect(self.monitor_url, connect_timeout=2, autocommit=True) as monitor:
                rows = monitor.execute("SELECT nodeport, reportedstate::text FROM pgautofailover.node").fetchall()
        except psycopg.Error:
            return {}
        return {int(port): str(state) for port, state in rows}

    def primary(self) -> Node:
        """The node that takes writes now (asked of the nodes themselves)."""
        for node in self.nodes:
            if self._writable(node):
                return node
        raise LookupError("no node takes writes")

    def kill(self, node: Node) -> None:
        """SIGKILL ``node``'s pg_autoctl and its PostgreSQL: the machine is gone."""
        assert node.process is not None
        self._killed = node.process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=10)
        # a backend of the killed server may linger a moment: they are in the group too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)

    def wait_promoted(self, old: Node, timeout: float = 60) -> Node:
        """Wait until the monitor reports a node other than ``old`` in a writable state
        and that node is out of recovery (the promotion as the manager tells it); returns it."""
        deadline = time.monotonic() + timeout
        others = [node for node in self.nodes if node is not old]
        while True:
            states = self.states()
            for node in others:
                if states.get(node.port) in WRITABLE_STATES and self._writable(node):
                    return node
            if time.monotonic() > deadline:
                raise TimeoutError(f"no standby was promoted within {timeout} s; states {self.states()}")
            time.sleep(0.02)

    def log_tail(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop every pg_autoctl (each stops its PostgreSQL), then kill what is left."""
        processes = [p for p in [*(n.process for n in self.nodes), self._monitor] if p is not None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)


@contextlib.contextmanager
def formation(
    monitor_port: int, node_ports: tuple[int, int], database: str = "kenning", *, logs_to: Path | None = None
) -> Iterator[Formation]:
    """A started formation (see ``Formation.start``), stopped and removed at the end; its
    pg_autoctl logs are copied to ``logs_to`` first, if given."""
    root = Path(tempfile.mkdtemp(prefix="kenning-autofailover-"))
    user = _system_user()
    if user is not None:  # the folder is the postgres user's: its data, sockets, configuration
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    running = Formation(root, monitor_port, node_ports, database)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        if logs_to is not None:
            for log in root.glob("*.log"):
                shutil.copy(log, logs_to / f"pg_autoctl-{log.name}")
        shutil.rmtree(root, ignore_errors=True)
