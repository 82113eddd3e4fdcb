"""A seeded chaos run (issue 13, item 10; issue 25): a few hundred mixed workflows and
events, on workers of two versions of the app, while processes are killed, stopped, cut
off from PostgreSQL, PostgreSQL itself is restarted, and one worker is killed with at
least 20 instances in flight, and a second scheduler is stopped inside a cron tick's
transaction, and bursts of starts over many keys go into queues with per-key limits
(tests/chaos_keys.py); then every invariant, every accepted event, cron tick and keyed
start accounted for, no key over its limit, and nothing lost. ``KENNING_CHAOS_SEED``
picks the schedule of faults; ``scripts/chaos.py`` runs the same scenario longer for
release checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chaos_schedule import DEFAULT_SEED, ChaosConfig
from tests.chaos_support import run_scenario, verdict, write_figures
from tests.logguard import expect_log
from tests.support import ProcessPool

SEED = int(os.environ.get("KENNING_CHAOS_SEED", DEFAULT_SEED))


@pytest.mark.timeout(240)
async def test_chaos(tmp_path: Path, processes: ProcessPool) -> None:
    expect_log("instance.failed", workflow="chaos_saga")  # the saga fails on purpose, then compensates
    # the worker cut off without a reset (tests/chaos_silent.py) sees its own commits hang, and says so
    expect_log("database.commits_stalled", process_id="chaos-w1")
    side_channel = tmp_path / "executions.log"
    side_channel.touch()
    config = ChaosConfig(seed=SEED)
    figures = await run_scenario(config, processes, tmp_path, str(side_channel))
    summary = write_figures(figures, tmp_path / "chaos.json")
    print(json.dumps(summary, indent=2, default=str))  # the test's log: faults and figures
    problems = verdict(figures)
    assert not problems, (
        f"chaos seed {SEED} (rerun with KENNING_CHAOS_SEED={SEED}); log and figures in {tmp_path}:\n"
        + "\n".join(problems)
    )
