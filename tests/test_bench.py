"""The benchmark runs on a tiny configuration and reports every field (no speed asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT


def test_quick_benchmark_reports_every_field(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kenning.bench",
            "--quick",
            "--database-url",
            pg_server_url,
            "--workflows",
            "20",
            "--workers",
            "1,2",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(output.read_text())
    limits = report["limits"]
    assert limits["insert_per_second"] > 0
    assert limits["pgbench_tps"] is None or limits["pgbench_tps"] > 0
    assert limits["bare_engine"]["workflows_per_second"] > 0 and limits["bare_engine"]["commits_per_workflow"] >= 3
    assert [r["workers"] for r in report["throughput"]] == [1, 2]
    for row in report["throughput"]:
        assert set(row) >= {
            "workflows_per_second",
            "steps_per_second",
            "commits_per_workflow",
            "worker_cpu_ms_per_workflow",
            "postgres_cpu_ms_per_workflow",
        }
        assert row["workflows"] == 20 and row["workflows_per_second"] > 0
        # three steps and a start at the least; a broken fold or claim would show here
        assert 3.0 <= row["commits_per_workflow"] < 12
    assert report["scale"]["claim_loaded"]["uses_partial_index"] is True
    assert set(report["long"]["ms_per_step"]) == {"5", "20"}
    assert "workers  wf/s" in done.stdout and "long workflows" in done.stdout
