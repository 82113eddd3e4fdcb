"""The chaos scenario of ``tests/system/test_chaos.py``, longer, for release checks.

    .venv/bin/python scripts/chaos.py --duration 300 --instances 1500 --seed 1307 --out bench-results/chaos.json

Starts its own embedded PostgreSQL under ``--work-dir`` (never the machine's server) and
workers on two versions of the app, injects faults for ``--duration`` seconds (kills,
stops, PostgreSQL restarts, partitions, scaled with the duration; one mass kill of a
worker holding at least 20 instances), waits for quiescence, checks every invariant and
that every accepted event was accounted for, and writes the figures as JSON. Exit code 0
when nothing was lost and every invariant holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos_schedule import DEFAULT_SEED, ChaosConfig
from tests.chaos_support import run_scenario, verdict, write_figures
from tests.support import ProcessPool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of faults")
    parser.add_argument("--instances", type=int, default=1500)
    parser.add_argument("--settle", type=float, default=180.0, help="deadline for quiescence after the faults")
    parser.add_argument("--out", type=Path, default=Path("bench-results/chaos.json"))
    parser.add_argument("--work-dir", type=Path, default=None, help="logs and the database (default: a temp dir)")
    options = parser.parse_args()
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="kenning-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    config = ChaosConfig(
        seed=options.seed,
        instances=options.instances,
        fault_seconds=options.duration,
        settle_seconds=options.settle,
        pg_restarts=max(2, round(options.duration / 30)),
        partitions=max(1, round(options.duration / 60)),
    )
    side_channel = work_dir / "executions.log"
    side_channel.touch()
    pool = ProcessPool(str(work_dir))
    try:
        figures = asyncio.run(run_scenario(config, pool, work_dir, str(side_channel)))
    finally:
        pool.stop_all()
    summary = write_figures(figures, options.out)
    sys.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "fault_log"}, indent=2, default=str) + "\n")
    problems = verdict(figures)
    for line in problems:
        sys.stderr.write(f"chaos seed {options.seed}: {line}\n")
    sys.stderr.write(f"logs: {work_dir}; figures: {options.out}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
