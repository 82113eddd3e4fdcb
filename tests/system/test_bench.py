"""The benchmark runs on a tiny configuration and reports every field (no speed asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kenning_devtools.bench.main import SECTIONS
from kenning_devtools.bench.sections import TABLE, TARGETS
from tests import logguard
from tests.support import REPO_ROOT

TARGET_NAMES = {target.name for target in TARGETS}


# the recovery and agent sections have tests of their own (below); the all-sections run leaves them out
ALL_BUT_RECOVERY = [s for s in SECTIONS if s not in ("recovery", "agent")]
# the targets of the sections it leaves out, and of those run only when named (offload): not judged
NOT_RUN = {target.name for section in TABLE if section.name not in ALL_BUT_RECOVERY for target in section.targets}


def _ordered_percentiles(section: dict[str, Any], prefix: str = "") -> None:
    assert 0 <= section[f"{prefix}p50_ms"] <= section[f"{prefix}p99_ms"] <= section[f"{prefix}max_ms"]


# It runs beside other tests (it starts first, so it is not the last to end): 44 s in a serial
# run on an idle 2-CPU machine (85 s there before the quick configuration ran scale in one round,
# the queued modes on one set of workers, each fleet's processes side by side, and read the
# commits after its processes exit without a fixed wait); parallel runs under load took 2.5-4x as long.
@pytest.mark.timeout(500)
def test_quick_benchmark_reports_every_field(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(
        pg_server_url,
        output,
        ["--workflows", "20", "--workers", "1,2", "--sections", ",".join(ALL_BUT_RECOVERY)],
        timeout=480,
    )
    report = json.loads(output.read_text())
    assert report["sections"] == ALL_BUT_RECOVERY
    assert len(report["machine"]["load_average_at_start"]) == 3
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
            "client_cpu_ms_per_workflow",
            "machine_cpu_busy",
            "starts_per_second",
        }
        assert row["client_cpu_ms_per_workflow"] > 0 and 0 < row["machine_cpu_busy"] <= 1
        # None on a server other databases used in the window (the tests' shared one)
        assert row["postgres_cpu_ms_per_workflow"] is None or row["postgres_cpu_ms_per_workflow"] >= 0
        assert row["starts_per_second"] >= row["workflows_per_second"]  # none completes before it starts
        assert row["workflows"] == 20 and row["workflows_per_second"] > 0
        # group commit lets workflows share commits, so there is no floor above zero; a
        # broken fold or claim loop would show as many more than a write per step
        assert 0 < row["commits_per_workflow"] < 12

    result = report["result_latency"]
    assert result["workers"] == 2 and result["sequential"]["samples"] == 10
    assert result["concurrent"]["callers"] == 4 and result["concurrent"]["samples"] == 20
    _ordered_percentiles(result["sequential"])
    _ordered_percentiles(result["concurrent"])
    # the start, a claim, the steps and the result read at least; a poll per few
    # milliseconds, or a NOTIFY per instance to many listeners, would show as many more
    assert 3 < result["commits_per_sequential_workflow"] < 30

    event = report["event_latency"]
    assert event["samples"] == 10
    _ordered_percentiles(event)
    assert event["min_ms"] > 0  # the activity cannot start before the POST was sent
    _ordered_percentiles(event["post_response"])

    timer = report["timer_lateness"]
    assert timer["samples"] == 10 and timer["timer_seconds"] == 0.2
    _ordered_percentiles(timer)
    assert timer["early"] == 0 and timer["min_ms"] >= 0  # never early: a correctness check

    ingress = report["ingress"]
    assert ingress["clients"] == 8 and ingress["ingress_workers"] == 2
    assert ingress["accepted"] > 0 and ingress["rejected"] == 0 and ingress["events_per_second"] > 0
    _ordered_percentiles(ingress, "response_")
    assert ingress["insert_limit_per_second"] == limits["insert_per_second"]
    assert ingress["share_of_insert_limit"] > 0
    assert set(ingress["cpu_ms_per_event"]) == {"ingress", "client", "postgres_backends"}
    assert ingress["cpu_ms_per_event"]["ingress"] > 0
    assert ingress["new_database_sessions"] is None or ingress["new_database_sessions"] >= 0

    key_rate = report["flow_key_rate"]
    assert (key_rate["limit"], key_rate["period_seconds"]) == (10, 1.0)
    assert key_rate["most_in_a_window"] == key_rate["limit"] and 0 < key_rate["pace"] <= 1.05
    assert key_rate["quiet_waited_ms"] is not None
    assert report["scale"]["claim_loaded"]["uses_partial_index"] is True
    assert report["scale"]["autovacuum_wait_seconds"] >= 0
    assert set(report["long"]["ms_per_step"]) == {"5", "20"}
    chain = report["events_long"]
    assert set(chain["events"]) == set(chain["ms_per_event"]) == {"4", "10"}
    assert chain["growth_ratio"] > 0
    resume = report["resume"]
    assert (resume["steps"], resume["continue_every"]) == (60, 20)
    assert resume["with_continue_as_new"]["runs"] == 4 and resume["without"]["runs"] == 1
    for loop in (resume["with_continue_as_new"], resume["without"]):
        assert loop["resume_ms_early"] > 0 and loop["resume_ms_late"] > 0 and loop["late_over_early"] > 0

    stream = report["stream_latency"]
    assert "event_latency" not in stream  # the event section's latency is the one beside it
    _check_stream_section(stream)

    found = report["targets"]
    assert set(found) == TARGET_NAMES
    for name, target in found.items():
        assert set(target) == {"target", "value", "met"} and target["target"]
        no_pgbench = name == "commit_rate_share_of_pgbench" and limits["pgbench_tps"] is None
        if no_pgbench or name in NOT_RUN:  # pgbench missing; the section not run
            assert target["met"] is None
        else:  # every other section ran, so every other target was judged
            assert target["met"] in (True, False), name
    assert found["timer_never_early"]["met"] is True

    for heading in (
        "workers  wf/s",
        "start -> result",
        "event POST -> next activity",
        "timer lateness",
        "stream entry written -> SSE event",
        "ingress (8 clients",
        "targets",
    ):
        assert heading in done.stdout, heading
    assert "long workflows" in done.stdout and "event chains" in done.stdout and "resume after 60 steps" in done.stdout


def _check_stream_section(stream: dict[str, Any]) -> None:
    """The stream section's quick configuration: 5 entries per stream, 4 streams at once,
    20 readers of one; every reader got every entry, and 20 readers cost one listener."""
    runs = (stream["one"], stream["many"], stream["readers"])
    assert [(r["streams"], r["readers"]) for r in runs] == [(1, 1), (4, 4), (1, 20)]
    for run in runs:
        assert run["samples"] == run["readers"] * run["entries_per_stream"] == run["readers"] * 5
        _ordered_percentiles(run)
        # CPU counters tick in 10 ms: a quick run of 5 entries may read 0
        assert run["entries_per_second"] > 0 and run["worker_cpu_ms_per_entry"] >= 0
    assert stream["readers"]["ingress_listeners"] == 1


# About 20 s: three fleets' worth of streams (1, 4 at once, 1 read by 20) and 10 events.
@pytest.mark.timeout(200)
def test_the_stream_section_alone_measures_the_event_latency_beside_it(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(pg_server_url, output, ["--sections", "stream"], timeout=180)
    report = json.loads(output.read_text())
    stream = report["stream_latency"]
    _check_stream_section(stream)
    assert stream["event_latency"]["samples"] == 10  # its own, since the event section did not run
    assert report["targets"]["stream_readers_one_listener"]["met"] is True
    assert report["targets"]["stream_p99_ms"]["met"] in (True, False)
    assert "beside the event latency of this run" in done.stdout


# About 30 s: the quick throughput run twice, plaintext and with a key.
@pytest.mark.timeout(200)
def test_the_encryption_section_reports_its_cost_as_ratios_of_one_run(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(pg_server_url, output, ["--sections", "encryption", "--workflows", "40"], timeout=180)
    section = json.loads(output.read_text())["encryption"]
    assert section["off"]["workflows"] == section["on"]["workflows"] == 40
    for name in ("worker_cpu_ms_per_workflow", "client_cpu_ms_per_workflow", "workflows_per_second"):
        ratio = section["on_to_off"][name]
        assert ratio is None or ratio > 0, (name, ratio)
    assert section["seal_and_open_microseconds_per_payload"] > 0
    assert "Encryption (40 workflows" in done.stdout


# About 20 s: a worker, a scheduler and a console, one busy instance watched by 1 then 4 clients.
@pytest.mark.timeout(200)
def test_the_console_section_counts_the_consoles_statements_per_watcher(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(pg_server_url, output, ["--sections", "console"], timeout=180)
    section = json.loads(output.read_text())["console"]
    assert sorted(section["watchers"]) == ["1", "4"]
    for run in section["watchers"].values():
        # every page fetched is the page's own reads at least: the counter sees the console's SQL
        assert run["pages_per_second"] > 0 and run["statements_per_page"] > 5, run
        assert run["console_cpu_percent"] > 0, run
    assert "Console (one busy instance" in done.stdout


def _bench(url: str, output: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``kenning bench --quick`` with ``args`` on the tests' server, under the log guard."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kenning_devtools.bench",
            "--quick",
            "--database-url",
            url,
            "--output",
            str(output),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
    )
    guard = logguard.current()
    if guard is not None:
        guard.watch_text("kenning bench", done.stdout + "\n" + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# About 8 s: 10 instances of a 2 s activity on a worker with 3 s leases, killed just after
# a heartbeat. Taken over one at a time (before issue 25) it took 23 s: 10 claims of one,
# recovery / (lease + run) 4.6.
@pytest.mark.timeout(150)
def test_recovery_takes_a_killed_workers_instances_over_together(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(pg_server_url, output, ["--sections", "recovery"], timeout=120)
    report = json.loads(output.read_text())
    assert report["sections"] == ["recovery"]
    rec = report["recovery"]
    assert (rec["instances"], rec["activity_seconds"], rec["lease_seconds"]) == (10, 6.0, 3.0)
    # every instance was taken over, by one claim, and run again once (no double takeover)
    assert rec["taken_over"] == 10 and rec["most_runs"] == 2
    assert rec["claim_passes"] == [10] and rec["taken_over_at_once"] == 10
    assert 0 <= rec["first_takeover_after_expiry_seconds"] < rec["lease_seconds"]
    # the re-runs ran the whole activity: what the kill cost is the lease, then one run time
    assert rec["run_seconds_median"] >= 0.99 * rec["activity_seconds"]
    assert 0 < rec["lease_left_at_kill_seconds"] <= rec["lease_seconds"]
    # generous bounds (a loaded machine adds to each); one at a time read 4.6 and 10
    assert rec["recovery_over_lease_and_run"] < 3
    assert rec["after_expiry_seconds"] / rec["activity_seconds"] < 3
    assert rec["bound_seconds"] == rec["lease_seconds"] + rec["poll_seconds"] + rec["activity_seconds"]
    assert report["targets"]["recovery_within_bound"]["met"] in (True, False)
    assert report["targets"]["timer_never_early"]["met"] is None  # not run
    assert "recovery after kill -9 (10 instances" in done.stdout and "taken over 10 of 10" in done.stdout


# About 15 s: the agent bare in the bench's process, then durably on one worker, 10 runs each.
@pytest.mark.timeout(150)
def test_the_agent_section_measures_kennings_time_per_step(pg_server_url: str, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = _bench(pg_server_url, output, ["--sections", "agent"], timeout=120)
    report = json.loads(output.read_text())
    agent = report["agent"]
    assert agent["steps_per_run"] == 11
    for run in ("bare", "durable_with_events", "durable_without_events"):
        assert agent[run]["samples"] == 10
        _ordered_percentiles(agent[run])
    assert {"kenning_ms_per_step_with_events", "kenning_ms_per_step_without_events"} <= set(agent)
    assert report["targets"]["agent_ms_per_step"]["met"] is not None
    assert "Kenning's own time per step" in done.stdout
