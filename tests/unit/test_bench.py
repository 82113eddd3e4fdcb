"""The benchmark's figures from a report: the recovery summary and its target, the targets,
the sections and the percentiles. Running it: ``tests/system/test_bench.py``."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from kenning_devtools.bench import targets
from kenning_devtools.bench.main import EXTRA_SECTIONS, SECTIONS, add_arguments, section_list
from kenning_devtools.bench.recovery import summary
from kenning_devtools.bench.report import render
from kenning_devtools.bench.sections import TABLE, TARGETS
from kenning_devtools.bench.stats import percentile


def test_recovery_summary_and_target() -> None:
    together = summary(
        instances=4,
        activity_seconds=2.0,
        lease_seconds=3.0,
        lease_left=2.5,
        recovery=4.6,
        passes=[(0.01, 4)],
        taken_over=4,
        most_runs=2,
        run_seconds=[2.0, 2.0, 2.1, 2.0],
    )
    assert together["recovery_over_lease_and_run"] == 0.92 and together["after_expiry_seconds"] == 2.1
    assert together["bound_seconds"] == 6.0 and together["within_bound"] is True
    assert together["one_at_a_time_seconds"] == 10.5 and together["run_seconds_median"] == 2.0
    met = targets.evaluate({"recovery": together})["recovery_within_bound"]
    assert met["met"] is True and met["value"]["taken_over_at_once"] == 4
    one_by_one = summary(
        instances=4,
        activity_seconds=2.0,
        lease_seconds=3.0,
        lease_left=2.5,
        recovery=10.6,
        passes=[(0.01, 1), (2.0, 1), (4.0, 1), (6.0, 1)],
        taken_over=4,
        most_runs=2,
        run_seconds=[2.0] * 4,
    )
    assert one_by_one["taken_over_at_once"] == 1 and one_by_one["claim_passes"] == [1, 1, 1, 1]
    assert targets.evaluate({"recovery": one_by_one})["recovery_within_bound"]["met"] is False
    assert targets.evaluate({})["recovery_within_bound"]["met"] is None


def test_recovery_options_refuse_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kenning bench")
    add_arguments(parser)
    assert parser.parse_args(["--recovery-instances", "5"]).recovery_instances == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["--recovery-instances", "0"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--recovery-instances" in error and "Traceback" not in error


def _report(rate_two: float, early: int) -> dict[str, Any]:
    row = {
        "workflows_per_second": rate_two,
        "commits_per_workflow": 4.0,
        "worker_cpu_ms_per_workflow": 2.0,
        "postgres_cpu_ms_per_workflow": 1.0,
    }
    return {
        "machine": {"cpus": 2},
        "limits": {"pgbench_tps": 1000.0, "insert_per_second": 2000.0, "bare_engine": {"workflows_per_second": 400}},
        "throughput": [{**row, "workers": 1, "workflows_per_second": 100.0}, {**row, "workers": 2}],
        "timer_lateness": {"p99_ms": 10.0, "early": early},
    }


def test_targets_are_computed_from_the_run() -> None:
    met = targets.evaluate(_report(rate_two=300.0, early=0))
    assert met["workflows_per_second_2_workers"]["met"] is True
    assert met["share_of_bare_engine"] == {**met["share_of_bare_engine"], "value": 0.75, "met": True}
    assert met["commit_rate_share_of_pgbench"]["value"] == 1.2
    assert met["throughput_rises_with_workers"]["met"] is True
    assert met["timer_never_early"]["met"] is True and met["timer_p99_ms"]["met"] is True
    assert met["event_p99_ms"]["met"] is None  # section not run: not judged
    assert met["result_p50_ms"]["met"] is None

    waits = {"sequential": {"p50_ms": 3.0, "p99_ms": 25.0}, "commits_per_sequential_workflow": 5.5}
    judged = targets.evaluate({**_report(rate_two=300.0, early=0), "result_latency": waits})
    assert judged["result_p50_ms"] == {**judged["result_p50_ms"], "value": 3.0, "met": True}
    assert judged["result_p99_ms"]["met"] is False
    assert judged["commits_per_sequential_workflow"]["met"] is True

    missed = targets.evaluate(_report(rate_two=100.0, early=1))
    assert missed["workflows_per_second_2_workers"]["met"] is False
    assert missed["share_of_bare_engine"]["met"] is False
    assert missed["timer_never_early"]["met"] is False
    # no gain from the second worker while the CPUs were 15 % busy: not saturated, so missed
    assert missed["throughput_rises_with_workers"]["met"] is False


def test_sections_are_checked_and_percentiles_are_nearest_rank() -> None:
    assert section_list("event, timer") == ["event", "timer"]
    with pytest.raises(argparse.ArgumentTypeError, match="bogus"):
        section_list("limits,bogus")
    assert percentile([float(v) for v in range(1, 201)], 99) == 198.0
    assert percentile([5.0], 50) == 5.0


def test_the_resume_target_judges_the_continue_as_new_loop() -> None:
    def report(ratio: float) -> dict[str, Any]:
        loop = {"late_over_early": ratio}
        return {"resume": {"with_continue_as_new": loop, "without": {"late_over_early": 40.0}}}

    assert targets.evaluate(report(1.1))["flat_resume_with_continue_as_new"]["met"] is True
    assert targets.evaluate(report(3.0))["flat_resume_with_continue_as_new"]["met"] is False
    assert targets.evaluate({})["flat_resume_with_continue_as_new"]["met"] is None


def test_the_failover_section_is_run_when_named_and_reported() -> None:
    from kenning_devtools.bench.failover import summary

    assert section_list("failover") == ["failover"]
    run = summary(
        kill_to_promotion=6.971, to_first_step=0.134, to_in_flight_done=5.9, started=44, started_before_kill=40, lost=0
    )
    assert run["first_step_within_poll"] is True and run["in_flight_within_lease_and_poll"] is True
    assert run["promotion_to_first_step_seconds"] == 0.13
    report = {"configuration": "full", "duration_seconds": 27.1, "machine": {"cpus": 2}}
    text = render({**report, "failover": run})
    assert "first step on the new primary 0.13 s after the promotion" in text and "lost 0" in text
    assert "failover skipped: no pg_autoctl" in render({**report, "failover": {"skipped": "no pg_autoctl"}})


def test_the_offload_section_is_run_when_named_and_its_memory_target_checked() -> None:
    assert section_list("offload") == ["offload"]
    run = {
        "store_seconds": 6.1,
        "load_seconds": 4.5,
        "store_above_idle_per_value": 3.04,
        "load_above_idle_per_value": 2.1,
        "worker_peak_mb": 399.5,
        "worker_idle_mb": 95.2,
        "above_idle_per_value": 3.04,
    }
    section = {"100MB": run, "largest_multiple": 3.04}
    assert targets.evaluate({"offload": section})["offload_memory_multiple"]["met"] is True
    assert (
        targets.evaluate({"offload": {**section, "largest_multiple": 9.0}})["offload_memory_multiple"]["met"] is False
    )
    assert targets.evaluate({})["offload_memory_multiple"]["met"] is None
    report = {"configuration": "full", "duration_seconds": 60.0, "machine": {"cpus": 2}, "offload": section}
    assert "100MB: store 6.1 s at 3.04x, load 4.5 s at 2.1x the value above idle; worker peak 399.5 MB" in render(
        report
    )


def test_the_section_table_has_every_section_once_and_judges_none_not_run() -> None:
    """What the printer, the targets and the system test read: an entry per ``--sections``
    name, target names unique (a repeated one would hide the other in the report's dict),
    and a report whose sections did not run printing its heading only, every target unjudged."""
    assert sorted(section.name for section in TABLE) == sorted({*SECTIONS, *EXTRA_SECTIONS})
    names = [target.name for target in TARGETS]
    assert len(names) == len(set(names)) == len(targets.evaluate({}))
    assert all(t["value"] is None and t["met"] is None for t in targets.evaluate({}).values())
    heading = {"configuration": "quick", "duration_seconds": 1.0, "machine": {"cpus": 2}}
    assert len(render(heading).splitlines()) == 1
