"""Issue 7's targets (and issues 15 and 25's), each checked against this run's own
measurements (never typed in): ``{"target": what it asks, "value": what this run
measured, "met": True/False, or None when the sections it needs were not run}``."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

MIN_WORKFLOWS_PER_SECOND = 250.0  # with 2 worker processes
MIN_SHARE_OF_BARE_ENGINE = 0.5
MAX_COMMITS_PER_WORKFLOW = 5.0
MIN_SHARE_OF_PGBENCH = 0.5  # workflows/s x commits/workflow over pgbench -N TPS
MIN_SCALING_GAIN = 1.05  # a worker count up must add 5 % ...
SATURATED_CPU_SHARE = 0.8  # ... unless the CPUs were already this busy
MAX_EVENT_P99_MS = 50.0
MAX_TIMER_P99_MS = 50.0
MIN_INGRESS_PER_SECOND = 2000.0
MIN_SHARE_OF_INSERT_LIMIT = 0.6
# issue 15: 1M finished + 100k waiting instances loaded, against empty tables in the same run
MAX_LOADED_CLAIM_DELTA_MS = 1.0  # claim time, loaded minus empty
MIN_LOADED_THROUGHPUT_SHARE = 0.9  # workflows/s, loaded over empty
MAX_GROWTH_RATIO = 1.5  # per-step time, long over short workflow (quadratic would be ~5-10)
MAX_RESULT_P50_MS = 5.0  # start -> result of a 3-activity workflow, one caller at a time
MAX_RESULT_P99_MS = 20.0
MAX_COMMITS_PER_SEQUENTIAL_WORKFLOW = 6.0  # with 2 worker processes
# issue 34: an activity's stream entry written -> received by an SSE client of the ingress
MAX_STREAM_P99_MS = 20.0
# issue 36: a worker storing and loading a value through the object store, peak memory
# above its idle size over the value's size (1, 10, 100 MB)
MAX_OFFLOAD_MEMORY_MULTIPLE = 6.0
MAX_AGENT_MS_PER_STEP = 2.0  # issue 34: Kenning's own time per agent step (model request or tool call)

Target = dict[str, Any]


def _target(text: str, value: Any, met: bool | None) -> Target:
    return {"target": text, "value": value, "met": met}


def _row(report: dict[str, Any], workers: int) -> dict[str, Any] | None:
    return next((r for r in report.get("throughput") or [] if r["workers"] == workers), None)


def cpu_busy_share(row: dict[str, Any], cpus: int) -> float | None:
    """Share of all CPUs busy during a throughput run: measured machine-wide (workers,
    PostgreSQL and the starting client share the CPUs), else workers plus PostgreSQL."""
    if row.get("machine_cpu_busy") is not None:
        return float(row["machine_cpu_busy"])
    pg = row.get("postgres_cpu_ms_per_workflow")
    if pg is None:
        return None
    ms_per_second = (row["worker_cpu_ms_per_workflow"] + pg) * row["workflows_per_second"]
    return round(float(ms_per_second) / 1000 / cpus, 2)


def _throughput_targets(report: dict[str, Any]) -> dict[str, Target]:
    limits = report.get("limits") or {}
    bare = (limits.get("bare_engine") or {}).get("workflows_per_second")
    pgbench = limits.get("pgbench_tps")
    two = _row(report, 2)
    rate = two["workflows_per_second"] if two else None
    rows = report.get("throughput") or []
    commits = max((r["commits_per_workflow"] for r in rows), default=None)
    commit_rate = rate * two["commits_per_workflow"] if two and rate else None
    targets = {
        "workflows_per_second_2_workers": _target(
            f">= {MIN_WORKFLOWS_PER_SECOND:.0f} workflows/s with 2 worker processes",
            rate,
            None if rate is None else rate >= MIN_WORKFLOWS_PER_SECOND,
        ),
        "share_of_bare_engine": _target(
            f">= {MIN_SHARE_OF_BARE_ENGINE:.0%} of the bare engine's workflows/s (2 workers)",
            round(rate / bare, 3) if rate and bare else None,
            None if not rate or not bare else rate / bare >= MIN_SHARE_OF_BARE_ENGINE,
        ),
        "commits_per_workflow": _target(
            f"<= {MAX_COMMITS_PER_WORKFLOW:.0f} commits per 3-activity workflow (worst worker count)",
            commits,
            None if commits is None else commits <= MAX_COMMITS_PER_WORKFLOW,
        ),
        "commit_rate_share_of_pgbench": _target(
            f"workflows/s x commits/workflow >= {MIN_SHARE_OF_PGBENCH:.0%} of pgbench -N TPS (2 workers)",
            round(commit_rate / pgbench, 3) if commit_rate and pgbench else None,
            None if not commit_rate or not pgbench else commit_rate / pgbench >= MIN_SHARE_OF_PGBENCH,
        ),
    }
    cpus = int((report.get("machine") or {}).get("cpus") or 1)
    curve = sorted(rows, key=lambda r: r["workers"])
    steps: list[bool] = []
    for low, high in pairwise(curve):
        busy = cpu_busy_share(low, cpus)
        gained = high["workflows_per_second"] >= MIN_SCALING_GAIN * low["workflows_per_second"]
        steps.append(gained or (busy is not None and busy >= SATURATED_CPU_SHARE))
    targets["throughput_rises_with_workers"] = _target(
        f"each added worker count gains >= {MIN_SCALING_GAIN - 1:.0%} workflows/s "
        f"unless the CPUs were already >= {SATURATED_CPU_SHARE:.0%} busy",
        {
            str(r["workers"]): {"workflows_per_second": r["workflows_per_second"], "cpu_busy": cpu_busy_share(r, cpus)}
            for r in curve
        }
        or None,
        all(steps) if steps else None,
    )
    return targets


def _latency_targets(report: dict[str, Any]) -> dict[str, Target]:
    event = report.get("event_latency")
    timer = report.get("timer_lateness")
    ingress = report.get("ingress")
    share = ingress.get("share_of_insert_limit") if ingress else None
    result = report.get("result_latency")
    sequential = result["sequential"] if result else None
    commits = result["commits_per_sequential_workflow"] if result else None
    return {
        "result_p50_ms": _target(
            f"start -> result p50 <= {MAX_RESULT_P50_MS:.0f} ms (one caller at a time)",
            sequential["p50_ms"] if sequential else None,
            None if not sequential else sequential["p50_ms"] <= MAX_RESULT_P50_MS,
        ),
        "result_p99_ms": _target(
            f"start -> result p99 <= {MAX_RESULT_P99_MS:.0f} ms (one caller at a time)",
            sequential["p99_ms"] if sequential else None,
            None if not sequential else sequential["p99_ms"] <= MAX_RESULT_P99_MS,
        ),
        "commits_per_sequential_workflow": _target(
            f"<= {MAX_COMMITS_PER_SEQUENTIAL_WORKFLOW:.0f} commits per sequential workflow with 2 workers",
            commits,
            None if commits is None else commits <= MAX_COMMITS_PER_SEQUENTIAL_WORKFLOW,
        ),
        "event_p99_ms": _target(
            f"event POST -> resumed activity p99 < {MAX_EVENT_P99_MS:.0f} ms",
            event["p99_ms"] if event else None,
            None if not event else event["p99_ms"] < MAX_EVENT_P99_MS,
        ),
        "timer_p99_ms": _target(
            f"timer lateness p99 < {MAX_TIMER_P99_MS:.0f} ms",
            timer["p99_ms"] if timer else None,
            None if not timer else timer["p99_ms"] < MAX_TIMER_P99_MS,
        ),
        "timer_never_early": _target(
            "no timer fired before its due time",
            timer["early"] if timer else None,
            None if not timer else timer["early"] == 0,
        ),
        "ingress_events_per_second": _target(
            f">= {MIN_INGRESS_PER_SECOND:.0f} events/s accepted by the ingress",
            ingress["events_per_second"] if ingress else None,
            None if not ingress else ingress["events_per_second"] >= MIN_INGRESS_PER_SECOND,
        ),
        "ingress_share_of_insert_limit": _target(
            f"ingress >= {MIN_SHARE_OF_INSERT_LIMIT:.0%} of the single-row insert limit",
            share,
            None if share is None else share >= MIN_SHARE_OF_INSERT_LIMIT,
        ),
    }


def _shape_targets(report: dict[str, Any]) -> dict[str, Target]:
    scale = report.get("scale")
    flat: bool | None = None
    value: dict[str, Any] | None = None
    if scale:
        delta, share = scale["claim_delta_ms"], scale["throughput_share"]
        value = {"claim_delta_ms": delta, "throughput_share": share}
        flat = (
            delta <= MAX_LOADED_CLAIM_DELTA_MS
            and bool(scale["claim_loaded"]["uses_partial_index"])
            and share >= MIN_LOADED_THROUGHPUT_SHARE
        )
    long = report.get("long")
    chain = report.get("events_long")
    return {
        "flat_at_scale": _target(
            f"tables loaded: claim time <= +{MAX_LOADED_CLAIM_DELTA_MS:.0f} ms and workflows/s "
            f">= {MIN_LOADED_THROUGHPUT_SHARE:.0%} of empty tables' (same run)",
            value,
            flat,
        ),
        "linear_long_activities": _target(
            f"ms per activity, long over short workflow <= {MAX_GROWTH_RATIO}",
            long["growth_ratio"] if long else None,
            None if not long else long["growth_ratio"] <= MAX_GROWTH_RATIO,
        ),
        "linear_long_events": _target(
            f"ms per awaited event, long over short chain <= {MAX_GROWTH_RATIO}",
            chain["growth_ratio"] if chain else None,
            None if not chain else chain["growth_ratio"] <= MAX_GROWTH_RATIO,
        ),
    }


def _recovery_targets(report: dict[str, Any]) -> dict[str, Target]:
    rec = report.get("recovery")
    return {
        "recovery_within_bound": _target(
            "a killed worker's in-flight instances all finish within lease + poll + run time after the kill",
            {k: rec[k] for k in ("recovery_seconds", "bound_seconds", "taken_over_at_once")} if rec else None,
            None if not rec else rec["recovery_seconds"] <= rec["bound_seconds"],
        ),
    }


def _stream_targets(report: dict[str, Any]) -> dict[str, Target]:
    """Issue 34: an entry reaches an SSE reader fast, and many readers share one listener."""
    st = report.get("stream_latency")
    one = st["one"] if st else None
    fanout = st["readers"] if st else None
    return {
        "stream_p99_ms": _target(
            f"stream entry written -> SSE event p99 <= {MAX_STREAM_P99_MS:.0f} ms (one stream)",
            one["p99_ms"] if one else None,
            None if not one else one["p99_ms"] <= MAX_STREAM_P99_MS,
        ),
        "stream_readers_one_listener": _target(
            "the readers of one stream cost the ingress one database listener",
            {"readers": fanout["readers"], "listeners": fanout["ingress_listeners"]} if fanout else None,
            None if not fanout else fanout["ingress_listeners"] == 1,
        ),
    }


def evaluate(report: dict[str, Any]) -> dict[str, Target]:
    """Every target of issues 7, 15, 25 and 34 against ``report`` (the sections this run measured)."""
    return {
        **_throughput_targets(report),
        **_latency_targets(report),
        **_shape_targets(report),
        **_recovery_targets(report),
        **_resume_targets(report),
        **_stream_targets(report),
        **_agent_targets(report),
        **_key_rate_targets(report),
        **_flow_targets(report),
        **_offload_targets(report),
    }


def _offload_targets(report: dict[str, Any]) -> dict[str, Target]:
    value = (report.get("offload") or {}).get("largest_multiple")
    return {
        "offload_memory_multiple": _target(
            f"a worker storing and loading a large value peaks at <= {MAX_OFFLOAD_MEMORY_MULTIPLE:.0f}x the value "
            "above its idle memory",
            value,
            None if value is None else value <= MAX_OFFLOAD_MEMORY_MULTIPLE,
        ),
    }


def _agent_targets(report: dict[str, Any]) -> dict[str, Target]:
    """Issue 34: a durable agent step costs at most this much beyond the bare agent's."""
    section = report.get("agent") or {}
    value = section.get("kenning_ms_per_step_with_events")
    return {
        "agent_ms_per_step": _target(
            f"Kenning's own time per agent step <= {MAX_AGENT_MS_PER_STEP:.0f} ms (events streamed)",
            value,
            None if value is None else value <= MAX_AGENT_MS_PER_STEP,
        ),
    }


KEY_RATE_PACE = 0.95  # a rate-limited key's starts reach this share of its limit


def _key_rate_targets(report: dict[str, Any]) -> dict[str, Target]:
    """Issue 35: a busy key starts at its RateLimit's pace, never over it."""
    kr = report.get("flow_key_rate")
    return {
        "key_rate_pace": _target(
            f"starts of a rate-limited key >= {KEY_RATE_PACE:.0%} of its limit, no window over it",
            {k: kr[k] for k in ("pace", "most_in_a_window", "limit", "quiet_waited_ms")} if kr else None,
            None if not kr else (kr["pace"] or 0) >= KEY_RATE_PACE and kr["most_in_a_window"] <= kr["limit"],
        ),
    }


MAX_FLOW_RELEASE_P99_MS = 50.0  # issue 35: a quiet key's instance starts within this


def _flow_targets(report: dict[str, Any]) -> dict[str, Target]:
    """Issue 35: each burst of a key's debounced starts is one instance, released promptly."""
    flow = report.get("flow")
    p99 = (flow.get("release_delay") or {}).get("p99_ms") if flow else None
    return {
        "flow_instances_exact": _target(
            "debounced bursts: instances per key exactly as expected, every start folded once",
            None if flow is None else flow["exact"],
            None if flow is None else bool(flow["exact"]),
        ),
        "flow_release_p99": _target(
            f"quiet period's end to the instance's start p99 <= {MAX_FLOW_RELEASE_P99_MS:g} ms",
            p99,
            None if p99 is None else p99 <= MAX_FLOW_RELEASE_P99_MS,
        ),
    }


def _resume_targets(report: dict[str, Any]) -> dict[str, Target]:
    """Issue 29: with continue_as_new, a resume late in a long loop costs what one early does."""
    rs = report.get("resume")
    ratio = rs["with_continue_as_new"]["late_over_early"] if rs else None
    return {
        "flat_resume_with_continue_as_new": _target(
            f"resume late over early in a continue_as_new loop <= {MAX_GROWTH_RATIO}",
            ratio,
            None if ratio is None else ratio <= MAX_GROWTH_RATIO,
        ),
    }
