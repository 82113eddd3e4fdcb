"""The chaos run's faults drawn from a seed (``tests/chaos_schedule.py``): the same seed gives
the same schedule, and every seed's mass kill has nothing else hitting that worker or
PostgreSQL around it. The run itself: ``tests/system/test_chaos.py``."""

from __future__ import annotations

import os

import pytest

from tests.chaos_schedule import DEFAULT_SEED, LOADED, ChaosConfig, quiet, schedule

SEED = int(os.environ.get("KENNING_CHAOS_SEED", DEFAULT_SEED))


def test_the_schedule_is_the_seed_s() -> None:
    config = ChaosConfig(seed=SEED)
    first, again = schedule(config), schedule(config)
    assert first == again
    kinds = {f.kind for f in first}
    assert kinds == {"kill", "stop", "pg_restart", "partition", "kill_loaded"}, kinds
    targets = {f.target for f in first if f.kind in ("kill", "stop")}
    assert len(targets) >= 4, f"seed {SEED} hits too few kinds of process: {targets}"
    # one mass kill, of the loaded worker, with nothing else hitting it or PostgreSQL around it
    (mass_kill,) = [f for f in first if f.kind == "kill_loaded"]
    assert mass_kill.target == LOADED and 0 < mass_kill.at < config.fault_seconds
    near = [f for f in first if quiet(mass_kill, f.at) and (f.target == LOADED or f.kind == "pg_restart")]
    assert near == [mass_kill], near


@pytest.mark.parametrize("seed", range(50))
def test_every_seed_s_schedule_keeps_the_mass_kill_quiet(seed: int) -> None:
    faults = schedule(ChaosConfig(seed=seed))
    (mass_kill,) = [f for f in faults if f.kind == "kill_loaded"]
    assert [f for f in faults if quiet(mass_kill, f.at) and (f.target == LOADED or f.kind == "pg_restart")] == [
        mass_kill
    ]
    assert all(0 < f.at < ChaosConfig().fault_seconds for f in faults)
