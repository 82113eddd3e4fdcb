"""The chaos scenario, shared by ``tests/system/test_chaos.py`` (short, in CI) and
``scripts/chaos.py`` (long, for release checks).

On a PostgreSQL of its own (the embedded wheel, its own data directory and socket, never
the machine's server) it runs three workers on two versions of the app (two on the new
``tests.apps.chaos``, one on the old ``tests.apps.chaos_core``, which lacks the
``chaos.start`` workflow and the ``chaos.audit`` handler: a rolling deploy), a scheduler, a
relayer to a receiver and an ingress; starts a few hundred mixed workflows and posts
events through the ingress; and, on a schedule drawn from a seed, SIGKILLs and restarts or
SIGSTOPs and continues each kind of process, restarts PostgreSQL with ``pg_ctl -m
immediate``, cuts one worker off from the database through a TCP proxy, and once kills a
worker holding at least ``MIN_IN_FLIGHT`` instances (the mass kill, after a burst of slow
ones), and once stops a second scheduler inside a cron tick's transaction
(``tests/chaos_cron.py``), and sends bursts of starts over many keys into queues with
per-key limits (``tests/chaos_keys.py``). After the seeded faults, the silent-worker phases
(``tests/chaos_silent.py``) stop and cut off that worker inside its transaction. Then it
waits for quiescence, runs every invariant and counts what was lost: every cron tick due
while a scheduler ran must have started once, and every accepted event must have started
its workflow, been delivered, been handled once, or be marked as having no receiver, as its
type says. Same seed, same schedule (the timing of the processes is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from kenning.client import Client
from kenning.db.migrate import migrate
from kenning.hosting.embedded import with_database
from tests.apps import chaos as chaos_app
from tests.chaos_cron import CRON_APP, CronPhase
from tests.chaos_keys import KeysPhase
from tests.chaos_postgres import OwnedPostgres, owned_postgres
from tests.chaos_schedule import (
    LEASE_SECONDS,
    LOADED,
    PARTITIONED,
    ChaosConfig,
    Fault,
    schedule,
)
from tests.chaos_silent import IDLE_IN_TRANSACTION_SECONDS, silent_phase_problems, silent_worker_phases
from tests.ingress_support import TcpProxy
from tests.invariants import activity_policies, check_invariants, event_outcomes, handler_runs
from tests.relayer_support import Receiver, start_receiver
from tests.support import ProcessPool, executions, free_port

APP = "tests.apps.chaos"  # the new version of the app
OLD_APP = "tests.apps.chaos_core"  # the old one: no chaos.start workflow, no chaos.audit handler
UNHEARD = "chaos.unheard"  # an event type nothing receives, in any version
KINDS = (
    "chaos_steps",
    "chaos_timer",
    "chaos_event",
    "chaos_saga",
    chaos_app.STARTER,
    chaos_app.AUDIT,
    UNHEARD,
    chaos_app.DEBOUNCED,
    chaos_app.BATCHED,
)
KIND_WEIGHTS = (30, 25, 20, 15, 10, 10, 2, 5, 5)
FOLDED_EVENTS = 3  # events posted per pick of a debounced or batched type, one group
# What every accepted event of each type must have become.
OUTCOMES = {
    chaos_app.STARTER: "started",
    chaos_app.AUDIT: "handled",
    chaos_app.ANSWER: "delivered",
    UNHEARD: "no receiver",
    chaos_app.DEBOUNCED: "folded",
    chaos_app.BATCHED: "folded",
}
WORKER_IDS = {"worker-0": "chaos-w0", PARTITIONED: "chaos-w1", "worker-old": "chaos-old"}
# The mass kill: a burst of slow instances, more than the other new worker's 16 slots hold
# (the old one lacks their workflow), so the loaded worker takes at least MIN_IN_FLIGHT of
# them; once it holds that many leases, it is SIGKILLed.
LOADED_CONCURRENCY = 40
MIN_IN_FLIGHT = 20
BURST = 40
SLOW_SECONDS = 2.5
DECLARE_SECONDS = 30.0  # for the new version's workers to start and declare their receivers


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
    events_by_outcome: dict[str, dict[str, int]] = field(default_factory=dict)  # type -> outcome -> events
    events_unaccounted: list[str] = field(default_factory=list)  # not what their type must become
    handler_runs_rolled_back: int = 0  # a handler's run cut short and run again (its effect outside: twice)
    mass_kill_in_flight: int = 0  # instances the loaded worker held leases of when SIGKILLed
    mass_kill_unfinished: list[str] = field(default_factory=list)
    most_leases_held: dict[str, int] = field(default_factory=dict)  # worker id -> most at once (sampled)
    effects_run: int = 0
    effects_repeated: int = 0  # an outside effect that ran again after a crash (at least once)
    effects_recorded_twice: int = 0
    outbox_rows: int = 0
    outbox_published: int = 0
    outbox_not_received: list[str] = field(default_factory=list)
    outbox_duplicates_received: int = 0
    invariants: str = "not run"
    settled: bool = False  # quiescent by the deadline: if not, "lost" may only mean "late"
    receivers_declared: bool = False  # the new version's, before the load began
    cron: dict[str, Any] = field(default_factory=dict)  # the cron phase (tests/chaos_cron.py)
    silent_phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # tests/chaos_silent.py
    keys: dict[str, Any] = field(default_factory=dict)  # the keys phase (tests/chaos_keys.py)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = dict(self.faults)  # asdict turns a Counter into one of (key, count) pairs
        out["instances_by_status"] = dict(self.instances_by_status)
        out["faults_injected"] = sum(self.faults.values())
        for key in (
            "instances_lost",
            "events_lost",
            "events_unaccounted",
            "mass_kill_unfinished",
            "outbox_not_received",
        ):
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
        self.accepted: dict[str, str] = {}  # ce-id -> type, of the events answered 202
        self.mass_kill: list[tuple[str, str]] = []  # (instance id, workflow) in flight at the mass kill
        self.answered: set[str] = set()
        self.t0 = 0.0
        self.stopping = False
        self.log = (work_dir / "chaos.log").open("a")
        self.cron = CronPhase(pool, self.url, self._query, self.say)
        self.keys = KeysPhase(self.url, self.say, config.seed)

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
        worker = ["worker", "--no-migrate", "--poll-interval", "0.2", "--lease-seconds", str(LEASE_SECONDS)]
        worker += ["--inline-retry-seconds", "1"]
        new, old = [*worker, "--app", APP], [*worker, "--app", OLD_APP]
        slots = ["--concurrency", "16", "--pool-size", "4"]
        loaded = ["--concurrency", str(LOADED_CONCURRENCY), "--pool-size", "6"]
        # every process's sessions freed within half a lease of going silent mid-transaction
        bound = {"KENNING_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": str(IDLE_IN_TRANSACTION_SECONDS)}
        direct = {"KENNING_DATABASE_URL": self.url, **bound}
        specs = {
            LOADED: ([*new, *loaded, "--worker-id", WORKER_IDS[LOADED]], direct),
            PARTITIONED: (
                [*new, *slots, "--worker-id", WORKER_IDS[PARTITIONED]],
                {"KENNING_DATABASE_URL": self.proxy.url, **bound},
            ),
            "worker-old": ([*old, *slots, "--worker-id", WORKER_IDS["worker-old"]], direct),
            "scheduler": (["scheduler", "--no-migrate", "--poll-interval", "0.5", "--app", CRON_APP], direct),
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
        if fault.kind == "kill_loaded":
            await self.kill_loaded(fault)
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

    async def kill_loaded(self, fault: Fault) -> None:
        """The mass kill: once the worker is up, a burst of slow instances; once it holds
        ``MIN_IN_FLIGHT`` leases (or after a deadline: the verdict then says how many),
        SIGKILL, down for ``fault.seconds``. Its instances are recorded, to be checked."""
        role = self.roles[fault.target]
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not (
            role.down_until == 0.0 and self._alive(role) and '"worker.started"' in self._log_of(role)
        ):
            await asyncio.sleep(0.1)
        await self.burst()
        held: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and len(held) < MIN_IN_FLIGHT:
            await asyncio.sleep(0.05)
            held = await self._query(
                "SELECT id, workflow_name FROM kenning_instances WHERE lease_owner = %s"
                " AND status IN ('running', 'compensating') AND available_at > now()",
                (WORKER_IDS[fault.target],),
            )
        self.mass_kill = [(str(i), str(w)) for i, w in held]
        self.figures.mass_kill_in_flight = len(held)
        self.say(f"mass kill: {fault.target} holds {len(held)} leases")
        if role.proc is not None and role.down_until == 0.0:
            with contextlib.suppress(psutil.NoSuchProcess):
                role.down_until = time.monotonic() + fault.seconds
                role.proc.send_signal(signal.SIGKILL)

    def _log_of(self, role: Role) -> str:
        return self.pool.log_of(role.proc) if role.proc is not None else ""

    async def burst(self) -> None:
        """``BURST`` slow instances at once (the client's starts share one commit)."""
        ids = [f"{chaos_app.SLOW}-{n}" for n in range(BURST)]
        async with Client(self.url) as client:
            await asyncio.gather(*(self.start(client, chaos_app.SLOW, i, {"seconds": SLOW_SECONDS}) for i in ids))

    async def watch_leases(self) -> None:
        """The most leases each worker held at once, sampled: every worker took part."""
        most = self.figures.most_leases_held
        while not self.stopping:
            rows = await self._query(
                "SELECT lease_owner, count(*) FROM kenning_instances WHERE lease_owner IS NOT NULL"
                " AND status IN ('running', 'compensating') AND available_at > now() GROUP BY lease_owner"
            )
            for owner, count in rows:
                most[str(owner)] = max(most.get(str(owner), 0), int(count))
            await asyncio.sleep(1.0)

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
                    self.accepted[event_id] = event_type
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
                if kind in (chaos_app.DEBOUNCED, chaos_app.BATCHED):
                    # a burst of one group's events (batches: groups shared across picks)
                    group = f"g{i}" if kind == chaos_app.DEBOUNCED else f"b{i % 3}"
                    for n in range(FOLDED_EVENTS):
                        await self.post(http, kind, f"{kind.partition('.')[2]}-{i}-{n}", {"group": group, "n": n})
                    continue
                if kind in (chaos_app.AUDIT, UNHEARD):
                    await self.post(http, kind, f"{kind.partition('.')[2]}-{i}", {"entry": f"a{i}"})
                    continue
                choices: dict[str, dict[str, Any]] = {
                    "chaos_steps": {"n": i},
                    "chaos_timer": {"seconds": round(rng.uniform(0.2, 1.0), 2)},
                    "chaos_event": {"key": f"e{i}"},
                    "chaos_saga": {"n": i},
                }
                await self.start(client, kind, f"{kind}-{i}", choices[kind])

    async def start(self, client: Client, kind: str, instance_id: str, inputs: dict[str, Any]) -> None:
        while True:
            try:  # the same id again after an outage: an existing instance is returned
                await client.start(kind, instance_id=instance_id, **inputs)
                break
            except Exception as error:
                self.say(f"start {instance_id} failed, retrying: {type(error).__name__}")
                await asyncio.sleep(0.3)
        self.started[instance_id] = kind

    async def _query(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement on a fresh connection: a database restart costs one poll, no more."""
        try:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=3) as conn:
                return await (await conn.execute(query, params)).fetchall()
        except psycopg.Error:
            return []

    async def new_version_declared(self) -> bool:
        """Wait until a worker of the new version has declared its receivers: from then on
        the old worker leaves ``chaos.start`` and ``chaos.audit`` events to the new ones
        (before, an event of a type no live worker receives is marked 'no receiver').
        After a deadline the run goes on regardless, so that the verdict shows what a
        fleet whose receivers are not declared loses, and says so."""
        wanted = (chaos_app.STARTER, chaos_app.AUDIT, chaos_app.DEBOUNCED, chaos_app.BATCHED)
        deadline = time.monotonic() + DECLARE_SECONDS
        while time.monotonic() < deadline:
            rows = await self._query(
                "SELECT count(DISTINCT event_type) FROM kenning_event_receivers WHERE event_type = ANY(%s)",
                (list(wanted),),
            )
            if rows and rows[0][0] == len(wanted):
                return True
            await asyncio.sleep(0.1)
        self.say(f"no worker of the new version declared {wanted} within {DECLARE_SECONDS} s; going on")
        return False

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
        expected = len(self.started) + len(self.start_events) + self.keys.expected()
        rows = await self._query(
            "SELECT (SELECT count(*) FROM kenning_instances WHERE status IN ('completed', 'failed', 'cancelled')) "
            "AS finished, (SELECT count(*) FROM kenning_inbox WHERE status = 'pending') AS inbox, "
            "(SELECT count(*) FROM kenning_outbox WHERE status IN ('pending', 'publishing')) AS outbox, "
            # a burst or batch still gathering or running (its events are processed already)
            "(SELECT count(*) FROM kenning_instances WHERE workflow_name = ANY(%s) "
            " AND status NOT IN ('completed', 'failed', 'cancelled')) AS folding",
            ([chaos_app.DEBOUNCED, chaos_app.BATCHED],),
        )
        return bool(rows) and rows[0][0] >= expected and rows[0][1] == 0 and rows[0][2] == 0 and rows[0][3] == 0

    async def run(self) -> Figures:
        with psycopg.connect(with_database(self.pg.url, "postgres"), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "kenning_chaos"')
        migrate(self.url)
        self.receiver = await start_receiver(self.pool)
        self.proxy = TcpProxy(self.url)
        await self.proxy.start()
        self.setup_roles()
        self.t0 = time.monotonic()
        self.figures.receivers_declared = await self.new_version_declared()
        self.t0 = time.monotonic()
        self.say(f"seed {self.config.seed}: {self.config}")
        supervisor = asyncio.create_task(self.supervise())
        answerer = asyncio.create_task(self.answer_events())
        watcher = asyncio.create_task(self.watch_leases())
        try:
            await asyncio.gather(
                self.faults(),
                self.start_instances(),
                self.cron.run(self.t0, self.config.fault_seconds),
                self.keys.run(self.t0, self.config.fault_seconds),
            )
            await silent_worker_phases(self, WORKER_IDS[PARTITIONED])
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
            await asyncio.gather(supervisor, answerer, watcher, return_exceptions=True)
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
            starts = sql.execute(
                "SELECT id, input ->> 'key' FROM kenning_instances WHERE workflow_name = %s", (chaos_app.STARTER,)
            ).fetchall()
            keys = {str(k): str(i) for i, k in starts}
            started_by_key = Counter(str(k) for _, k in starts)
            f.instances_started = len(self.started) + len(self.start_events)
            f.instances_by_status = Counter(status.values())
            for instance_id, kind in self.started.items():
                if status.get(instance_id) != chaos_app.EXPECTED[kind]:
                    f.instances_lost.append(f"{instance_id}: {status.get(instance_id, 'missing')}")
            for event_id, key in self.start_events.items():
                found = keys.get(key)
                if found is None or status.get(found) != chaos_app.EXPECTED[chaos_app.STARTER]:
                    f.instances_lost.append(f"{event_id} ({key}): {status.get(found or '', 'missing')}")
                elif started_by_key[key] != 1:
                    f.instances_lost.append(f"{event_id} ({key}): started {started_by_key[key]} times")
            folded = sql.execute(
                "SELECT id, workflow_name, status FROM kenning_instances WHERE workflow_name = ANY(%s)",
                ([chaos_app.DEBOUNCED, chaos_app.BATCHED],),
            ).fetchall()
            f.instances_lost += [f"{i} ({w}): {s}" for i, w, s in folded if s != chaos_app.EXPECTED[str(w)]]
            for instance_id, workflow in self.mass_kill:
                if status.get(instance_id) != chaos_app.EXPECTED.get(workflow):
                    f.mass_kill_unfinished.append(f"{instance_id}: {status.get(instance_id, 'missing')}")
            inbox = {str(e): str(s) for e, s in sql.execute("SELECT event_id, status FROM kenning_inbox").fetchall()}
            f.events_accepted = len(self.accepted)
            f.events_lost = sorted(
                f"{e}: {inbox.get(e, 'missing')}" for e in self.accepted if inbox.get(e) != "processed"
            )
            ran = executions(side_channel)
            self.account_events(sql, Counter(ran))
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
                check_invariants(
                    sql,
                    settled=True,
                    max_attempts=activity_policies(chaos_app),
                    executions=Counter(ran),
                    handled_types=[chaos_app.AUDIT],
                )
                f.invariants = "all hold"
            except AssertionError as error:
                f.invariants = f"violated: {error}"
            f.cron = asdict(self.cron.measure(sql))
            f.keys = asdict(self.keys.measure(sql))
        return f

    def account_events(self, sql: psycopg.Connection[tuple[Any, ...]], ran: Counter[str]) -> None:
        """What became of every accepted event (started, delivered, handled, 'no receiver'),
        by type; one that did not become what its type must is unaccounted for."""
        f = self.figures
        outcomes = event_outcomes(sql, ran)
        by_type: dict[str, Counter[str]] = {}
        for event_id, event_type in sorted(self.accepted.items()):
            outcome = outcomes.get(("/chaos", event_id), (event_type, "not processed"))[1]
            by_type.setdefault(event_type, Counter())[outcome] += 1
            if outcome != OUTCOMES.get(event_type):
                f.events_unaccounted.append(f"{event_id} ({event_type}): {outcome}")
        f.events_by_outcome = {t: dict(c) for t, c in sorted(by_type.items())}
        f.handler_runs_rolled_back = sum(rolled_back for _, rolled_back in handler_runs(sql, ran).values())


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
    if not figures.receivers_declared:
        problems.append(f"no worker of the new version declared its receivers within {DECLARE_SECONDS} s")
    if figures.instances_lost:
        problems.append(f"instances lost: {len(figures.instances_lost)}: {figures.instances_lost[:10]}")
    if figures.events_lost:
        problems.append(f"events lost: {len(figures.events_lost)}: {figures.events_lost[:10]}")
    if figures.effects_recorded_twice:
        problems.append(f"effects recorded twice: {figures.effects_recorded_twice}")
    if figures.outbox_not_received:
        problems.append(f"outbox events never received: {figures.outbox_not_received[:10]}")
    if figures.events_unaccounted:
        problems.append(
            f"events not started, delivered, handled or marked as their type says: "
            f"{len(figures.events_unaccounted)}: {figures.events_unaccounted[:10]}"
        )
    if figures.mass_kill_in_flight < MIN_IN_FLIGHT:
        problems.append(
            f"the mass kill found {figures.mass_kill_in_flight} instances in flight on {LOADED} "
            f"(at least {MIN_IN_FLIGHT} wanted)"
        )
    if figures.mass_kill_unfinished:
        problems.append(f"instances of the mass kill not finished: {figures.mass_kill_unfinished[:10]}")
    problems.extend(silent_phase_problems(figures))
    if figures.invariants != "all hold":
        problems.append(f"invariants: {figures.invariants}")
    problems.extend(figures.cron.get("problems", []))
    problems.extend(figures.keys.get("problems", []))
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
