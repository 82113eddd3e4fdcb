"""The chaos run's faults (``tests/chaos_support.py``), drawn from a seed: the same seed
gives the same list (the timing of the processes is not). Kills and stops of every kind
of process, PostgreSQL restarts, a partition of one worker from the database, and one
mass kill of a worker holding a burst of instances, with nothing else hitting that
worker or PostgreSQL around it."""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_SEED = 1307
LEASE_SECONDS = 3  # short, so work of a killed or stopped process is taken over within the run
ROLES = ("worker-0", "worker-1", "worker-old", "scheduler", "relayer", "ingress")
PARTITIONED = "worker-1"  # reaches PostgreSQL through the proxy
LOADED = "worker-0"  # the mass kill's target
# Around the mass kill nothing else hits its worker or PostgreSQL, whatever the seed: it
# must find the burst in flight (seconds before and after the fault's time).
QUIET_BEFORE, QUIET_AFTER = 8.0, 12.0


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
    kind: str  # kill, stop, pg_restart, partition, kill_loaded
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
    loaded = Fault(round(rng.uniform(0.3, 0.55) * window, 2), "kill_loaded", LOADED, round(rng.uniform(0.5, 1.5), 2))
    others = [role for role in ROLES if role != LOADED]
    for fault in faults:
        if fault.kind in ("kill", "stop") and fault.target == LOADED and quiet(loaded, fault.at):
            fault.target = rng.choice(others)
        elif fault.kind == "pg_restart" and quiet(loaded, fault.at):
            fault.at = round(rng.uniform(loaded.at + QUIET_AFTER, max(loaded.at + QUIET_AFTER, window - 2.0)), 2)
    faults.append(loaded)
    faults.sort(key=lambda f: f.at)
    return faults


def quiet(mass_kill: Fault, at: float) -> bool:
    """Whether ``at`` falls in the quiet spell around the mass kill."""
    return mass_kill.at - QUIET_BEFORE < at < mass_kill.at + QUIET_AFTER
