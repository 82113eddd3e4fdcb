"""The benchmark's sections, one entry each: the report key it writes, the lines it prints
in the table and the targets (issues 7, 15, 25, 29, 34, 35 and 36) judged from it. The
printer (``report.render``), the targets (``targets.evaluate``) and the tests read this
table, so a new section is one entry here (and its run in ``main``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

Report = dict[str, Any]
Verdict = tuple[Any, bool | None]  # what this run measured; met, or None when its section was not run

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
KEY_RATE_PACE = 0.95  # issue 35: a rate-limited key's starts reach this share of its limit
MAX_FLOW_RELEASE_P99_MS = 50.0  # issue 35: a quiet key's instance starts within this


@dataclass(frozen=True)
class Target:
    name: str
    text: str  # what it asks, its limit included
    judge: Callable[[Report], Verdict]


@dataclass(frozen=True)
class Section:
    name: str  # as ``--sections`` names it
    key: str  # where the report holds its results
    # its lines in the table, given its results and the whole report; printed only when it ran
    rows: Callable[[Any, Report], list[str]]
    targets: tuple[Target, ...] = ()


def at(data: dict[str, Any] | None, *path: str) -> Any:
    """The value at ``path``, None where a section along it is missing (not run)."""
    value: Any = data
    for key in path:
        if not value:
            return None
        value = value.get(key)
    return value


def measured(read: Callable[[Report], Any], ok: Callable[[Any], bool]) -> Callable[[Report], Verdict]:
    """The common judge: a value read from the report, met when ``ok`` holds, None when not measured."""

    def judge(report: Report) -> Verdict:
        value = read(report)
        return value, None if value is None else ok(value)

    return judge


def most(bound: float, *path: str) -> Callable[[Report], Verdict]:
    """Met when the value at ``path`` is at most ``bound``."""
    return measured(lambda report: at(report, *path), lambda value: value <= bound)


def least(bound: float, *path: str) -> Callable[[Report], Verdict]:
    """Met when the value at ``path`` is at least ``bound``."""
    return measured(lambda report: at(report, *path), lambda value: value >= bound)


def below(bound: float, *path: str) -> Callable[[Report], Verdict]:
    """Met when the value at ``path`` is under ``bound``."""
    return measured(lambda report: at(report, *path), lambda value: value < bound)


def fields(key: str, *names: str) -> Callable[[Report], dict[str, Any] | None]:
    """A target's value: these fields of section ``key``, None when it was not run."""
    return lambda report: {name: report[key][name] for name in names} if report.get(key) else None


def _share(part: float | None, whole: float | None, least: float) -> Verdict:
    if not part or not whole:
        return None, None
    return round(part / whole, 3), part / whole >= least


def ratio(value: float | None, limit: float | None) -> str:
    if not value or not limit:
        return "-"
    return f"{100 * value / limit:.0f}%"


def _two_workers(report: Report) -> dict[str, Any] | None:
    return next((r for r in report.get("throughput") or [] if r["workers"] == 2), None)


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


def _limits(lim: dict[str, Any], _: Report) -> list[str]:
    bare = lim["bare_engine"]
    return [
        f"limits ({lim['clients']} clients): pgbench -N {lim['pgbench_tps']} TPS; single-row insert "
        f"{lim['insert_per_second']}/s; bare engine {bare['workflows_per_second']:.0f} wf/s at "
        f"{bare['commits_per_workflow']:.2f} commits/wf",
    ]


def _throughput(rows: list[dict[str, Any]], report: Report) -> list[str]:
    lim = report.get("limits") or {}
    bare, pgbench = (lim.get("bare_engine") or {}).get("workflows_per_second"), lim.get("pgbench_tps")
    lines = [
        "workers  wf/s    starts/s  steps/s  commits/wf  worker CPU ms/wf  PG CPU ms/wf  client CPU ms/wf  CPUs busy  "
        "vs bare  commit rate vs pgbench",
    ]
    for r in rows:
        commit_rate = r["workflows_per_second"] * r["commits_per_workflow"]
        lines.append(
            f"{r['workers']:>7}  {r['workflows_per_second']:>6}  {r.get('starts_per_second', '-'):>8}  "
            f"{r['steps_per_second']:>7}  "
            f"{r['commits_per_workflow']:>10}  {r['worker_cpu_ms_per_workflow']:>16}  "
            f"{r['postgres_cpu_ms_per_workflow'] or '-':>12}  {r.get('client_cpu_ms_per_workflow', '-'):>16}  "
            f"{ratio(r.get('machine_cpu_busy'), 1.0):>9}  {ratio(r['workflows_per_second'], bare):>7}  "
            f"{ratio(commit_rate, pgbench):>6}"
        )
    return lines


def _share_of_bare_engine(report: Report) -> Verdict:
    two = _two_workers(report)
    bare = at(report, "limits", "bare_engine", "workflows_per_second")
    return _share(two["workflows_per_second"] if two else None, bare, MIN_SHARE_OF_BARE_ENGINE)


def _commit_rate_share_of_pgbench(report: Report) -> Verdict:
    two = _two_workers(report)
    rate = two["workflows_per_second"] if two else None
    commit_rate = rate * two["commits_per_workflow"] if two and rate else None
    return _share(commit_rate, at(report, "limits", "pgbench_tps"), MIN_SHARE_OF_PGBENCH)


def _rises_with_workers(report: Report) -> Verdict:
    cpus = int((report.get("machine") or {}).get("cpus") or 1)
    curve = sorted(report.get("throughput") or [], key=lambda r: r["workers"])
    steps: list[bool] = []
    for low, high in pairwise(curve):
        busy = cpu_busy_share(low, cpus)
        gained = high["workflows_per_second"] >= MIN_SCALING_GAIN * low["workflows_per_second"]
        steps.append(gained or (busy is not None and busy >= SATURATED_CPU_SHARE))
    value = {
        str(r["workers"]): {"workflows_per_second": r["workflows_per_second"], "cpu_busy": cpu_busy_share(r, cpus)}
        for r in curve
    }
    return value or None, all(steps) if steps else None


def _result(result: dict[str, Any], _: Report) -> list[str]:
    seq, conc = result["sequential"], result["concurrent"]
    return [
        f"start -> result ({result['workers']} workers): one caller at a time ({seq['samples']} samples) "
        f"p50 {seq['p50_ms']} ms, p99 {seq['p99_ms']} ms, max {seq['max_ms']} ms, "
        f"{result['commits_per_sequential_workflow']} commits/wf; {conc['callers']} callers at once "
        f"({conc['samples']} samples) p50 {conc['p50_ms']} ms, p99 {conc['p99_ms']} ms, max {conc['max_ms']} ms",
    ]


def _event(event: dict[str, Any], _: Report) -> list[str]:
    post = event["post_response"]
    return [
        f"event POST -> next activity ({event['samples']} samples): p50 {event['p50_ms']} ms, "
        f"p99 {event['p99_ms']} ms, max {event['max_ms']} ms (POST answered: p50 {post['p50_ms']} ms, "
        f"p99 {post['p99_ms']} ms)",
    ]


def _stream(stream: dict[str, Any], report: Report) -> list[str]:
    beside = stream.get("event_latency") or report.get("event_latency")
    runs = [("1 stream", stream["one"]), (f"{stream['many']['streams']} streams", stream["many"])]
    runs.append((f"1 stream, {stream['readers']['readers']} readers", stream["readers"]))
    lines = [f"stream entry written -> SSE event (an entry every {stream['interval_seconds']} s per stream):"]
    lines += [
        f"  {name}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms ({r['samples']} samples, "
        f"{r['entries_per_second']} entries/s, {r['ingress_listeners']} ingress listener(s))"
        for name, r in runs
    ]
    if beside:
        lines.append(f"  beside the event latency of this run: p50 {beside['p50_ms']} ms, p99 {beside['p99_ms']} ms")
    return lines


def _stream_readers(report: Report) -> dict[str, Any] | None:
    fanout = at(report, "stream_latency", "readers")
    return {"readers": fanout["readers"], "listeners": fanout["ingress_listeners"]} if fanout else None


def _timer(timer: dict[str, Any], _: Report) -> list[str]:
    return [
        f"timer lateness ({timer['samples']} timers of {timer['timer_seconds']} s): p50 {timer['p50_ms']} ms, "
        f"p99 {timer['p99_ms']} ms, max {timer['max_ms']} ms, min {timer['min_ms']} ms, early {timer['early']}",
    ]


def _ingress(ingress: dict[str, Any], report: Report) -> list[str]:
    cpu = ingress["cpu_ms_per_event"]
    return [
        f"ingress ({ingress['clients']} clients, {ingress['ingress_workers']} uvicorn workers, "
        f"{ingress['seconds']} s): {ingress['events_per_second']} events/s, "
        f"{ratio(ingress['events_per_second'], ingress['insert_limit_per_second'])} of the insert limit "
        f"({ingress['insert_limit_per_second']}/s); response p50 {ingress['response_p50_ms']} ms, "
        f"p99 {ingress['response_p99_ms']} ms; {ingress['rejected']} not accepted",
        f"  CPU ms per event: ingress {cpu['ingress']}, load client {cpu['client']}, "
        f"PostgreSQL backends {cpu['postgres_backends']}; "
        f"{ingress['new_database_sessions']} database connections opened meanwhile; ingress + PostgreSQL "
        f"CPU alone would allow {ingress['server_cpu_capacity_per_second']} events/s on {report['machine']['cpus']} "
        "CPUs",
    ]


def _scale(sc: dict[str, Any], _: Report) -> list[str]:
    return [
        f"scale: claim {sc['claim_empty']['claim_ms_median']} ms empty -> {sc['claim_loaded']['claim_ms_median']} "
        f"ms with {sc['finished_instances']} finished + {sc['waiting_instances']} waiting "
        f"(partial index: {sc['claim_loaded']['uses_partial_index']}); "
        f"{sc['throughput_loaded']['workers']} workers: {sc['throughput_loaded']['workflows_per_second']} wf/s "
        f"loaded vs {sc['throughput_empty']['workflows_per_second']} empty = {sc['throughput_share']:.0%} "
        f"(rounds: {', '.join(f'{s:.0%}' for s in sc['round_shares'])})",
    ]


def _flat_at_scale(report: Report) -> Verdict:
    scale = report.get("scale")
    if not scale:
        return None, None
    delta, share = scale["claim_delta_ms"], scale["throughput_share"]
    flat = (
        delta <= MAX_LOADED_CLAIM_DELTA_MS
        and bool(scale["claim_loaded"]["uses_partial_index"])
        and share >= MIN_LOADED_THROUGHPUT_SHARE
    )
    return {"claim_delta_ms": delta, "throughput_share": share}, flat


def _long(lg: dict[str, Any], _: Report) -> list[str]:
    return [f"long workflows: ms per step {lg['ms_per_step']}, growth ratio {lg['growth_ratio']} (1.0 = linear)"]


def _events_long(chain: dict[str, Any], _: Report) -> list[str]:
    return [
        f"event chains: total s {chain['events']}, ms per event from the first wait {chain['ms_per_event']}, "
        f"growth ratio {chain['growth_ratio']} (1.0 = linear)",
    ]


def _resume(rs: dict[str, Any], _: Report) -> list[str]:
    cont, plain = rs["with_continue_as_new"], rs["without"]
    return [
        f"resume after {rs['steps']} steps: with continue_as_new every {rs['continue_every']} "
        f"{cont['resume_ms_early']} -> {cont['resume_ms_late']} ms (x{cont['late_over_early']}); "
        f"without {plain['resume_ms_early']} -> {plain['resume_ms_late']} ms (x{plain['late_over_early']})",
    ]


def _queued(queued: dict[str, Any], _: Report) -> list[str]:
    """One row per mode (no queue, a queue, a queue with limits on)."""
    lines = [
        f"Queued throughput ({queued['workflows']} workflows, {queued['workers']} workers, "
        f"limits on: concurrency {queued['limited_concurrency']}, 64 partitions of at most 4)",
    ]
    for run in queued["runs"]:
        lines.append(
            f"  {run['mode']:<18} {run['workflows_per_second']:>8} workflows/s  "
            f"{run['worker_cpu_ms_per_workflow']:>7} worker CPU ms/workflow"
        )
    return lines


def _recovery(rec: dict[str, Any], _: Report) -> list[str]:
    """A killed worker's instances, finished by an idle one."""
    return [
        f"recovery after kill -9 ({rec['instances']} instances of a {rec['activity_seconds']} s activity in flight, "
        f"lease {rec['lease_seconds']} s, poll {rec['poll_seconds']} s): all done {rec['recovery_seconds']} s after "
        f"the kill = lease left {rec['lease_left_at_kill_seconds']} s + {rec['after_expiry_seconds']} s; "
        f"bound lease + poll + run {rec['bound_seconds']} s, recovery / (lease + run) "
        f"{rec['recovery_over_lease_and_run']}",
        f"  taken over {rec['taken_over_at_once']} of {rec['instances']} in the first claim "
        f"({rec['first_takeover_after_expiry_seconds']} s after the leases expired; claims {rec['claim_passes']}); "
        f"re-runs took {rec['run_seconds_median']} s (max {rec['run_seconds_max']}); "
        f"one at a time would take about {rec['one_at_a_time_seconds']} s",
    ]


def _relay(relay: dict[str, Any], _: Report) -> list[str]:
    """Per target, what crashing relayers delivered."""
    lines = [
        f"At least once ({relay['events']} events of {relay['instances']} instances, batches of "
        f"{relay['batch_size']}, relayer crash after {relay['crash_rate']:.0%} of answered batches)",
    ]
    for run in relay["targets"]:
        if "skipped" in run:
            lines.append(f"  {run['target']:<5} skipped: {run['skipped']}")
            continue
        lines.append(
            f"  {run['target']:<5} {run['crashes']:>3} crashes  {run['sends']:>6} sends  {run['messages']:>6} "
            f"messages  {run['distinct']:>6} distinct  {run['duplicates']:>5} duplicates "
            f"(at most {run['max_duplicates']})  {run['missing']} missing  {run['seconds']} s"
        )
    return lines


def _failover(run: dict[str, Any], _: Report) -> list[str]:
    """A primary lost under pg_auto_failover, the standby promoted."""
    if "skipped" in run:
        return [f"failover skipped: {run['skipped']}"]
    return [
        f"failover (pg_auto_failover, primary killed, {run['started']} workflows started through the multi-host URL, "
        f"poll {run['poll_seconds']} s, lease {run['lease_seconds']} s): promoted "
        f"{run['kill_to_promotion_seconds']} s after the kill; first step on the new primary "
        f"{run['promotion_to_first_step_seconds']} s after the promotion; the {run['started_before_kill']} started "
        f"before it all done {run['promotion_to_in_flight_done_seconds']} s after it; lost {run['lost']}",
    ]


def _agent(section: dict[str, Any], _: Report) -> list[str]:
    """The same agent bare and durable, Kenning's time per step."""
    if "skipped" in section:
        return [f"agent: skipped, {section['skipped']}"]
    bare, events, quiet = section["bare"], section["durable_with_events"], section["durable_without_events"]
    lines = [
        f"agent ({section['steps_per_run']} steps a run, one run at a time, {bare['samples']} runs each): "
        f"bare p50 {bare['p50_ms']} ms, {section.get('bare_with_events', {}).get('p50_ms')} ms with an event "
        f"handler; durable p50 {events['p50_ms']} ms with its event stream, "
        f"{quiet['p50_ms']} ms without; Kenning's own time per step {section['kenning_ms_per_step_with_events']} ms "
        f"with events, {section['kenning_ms_per_step_without_events']} ms without",
    ]
    if "commit" in section:  # what a step costs beside its floor, one commit (older reports lack it)
        lines.append(
            f"  a commit on its own (the floor of a step) p50 {section['commit']['p50_ms']} ms; per step "
            f"{section['per_step_over_commit_with_events']} / {section['per_step_over_commit_without_events']} "
            f"commits' time, {section['commits_per_step_with_events']} / {section['commits_per_step_without_events']} "
            f"commits, Kenning's CPU {section['kenning_cpu_ms_per_step_with_events']} / "
            f"{section['kenning_cpu_ms_per_step_without_events']} ms (with / without events)",
        )
    return lines


def _encryption(section: dict[str, Any], _: Report) -> list[str]:
    """The throughput run plaintext and sealed, the cost as ratios."""
    off, on, ratios = section["off"], section["on"], section["on_to_off"]
    return [
        f"Encryption ({section['workflows']} workflows, {section['workers']} worker, AES-256-GCM on every payload): "
        f"worker CPU {off['worker_cpu_ms_per_workflow']} -> {on['worker_cpu_ms_per_workflow']} ms/workflow "
        f"(x{ratios['worker_cpu_ms_per_workflow']}), client CPU x{ratios['client_cpu_ms_per_workflow']}, "
        f"workflows/s {off['workflows_per_second']} -> {on['workflows_per_second']} "
        f"(x{ratios['workflows_per_second']}); seal and open one payload "
        f"{section['seal_and_open_microseconds_per_payload']} us",
    ]


def _offload(section: dict[str, Any], _: Report) -> list[str]:
    """A worker storing and loading values through the object store."""
    lines = ["offload (a worker stores a value in the object store, another's replay loads it back):"]
    for name, run in section.items():
        if isinstance(run, dict):
            lines.append(
                f"  {name:>6}: store {run['store_seconds']} s at {run['store_above_idle_per_value']}x, "
                f"load {run['load_seconds']} s at {run['load_above_idle_per_value']}x the value above idle; "
                f"worker peak {run['worker_peak_mb']} MB (idle {run['worker_idle_mb']} MB)"
            )
    return lines


def _flow(flow: dict[str, Any], _: Report) -> list[str]:
    """Keyed bursts of debounced starts, the instances they made, the release delay."""
    delay = flow["release_delay"] or {}
    return [
        f"Debounced bursts ({flow['starts']} starts over {flow['keys']} keys, {flow['bursts_per_key']} bursts of "
        f"{flow['starts_per_burst']} per key, {flow['starts_per_second']} starts/s, period {flow['period_seconds']} s)",
        f"  instances {flow['instances']} of {flow['instances_expected']} expected, keys off count "
        f"{flow['keys_with_other_counts']}, starts folded {flow['starts_folded']}: "
        f"{'exact' if flow['exact'] else 'NOT EXACT'}",
        f"  quiet period's end to the instance's start: p50 {delay.get('p50_ms')} ms, p99 {delay.get('p99_ms')} ms, "
        f"max {delay.get('max_ms')} ms, min {delay.get('min_ms')} ms",
    ]


# In the order the table prints them; the targets print in this order too, at its end.
TABLE: tuple[Section, ...] = (
    Section("limits", "limits", _limits),
    Section(
        "throughput",
        "throughput",
        _throughput,
        (
            Target(
                "workflows_per_second_2_workers",
                f">= {MIN_WORKFLOWS_PER_SECOND:.0f} workflows/s with 2 worker processes",
                measured(
                    lambda r: at(_two_workers(r), "workflows_per_second"), lambda v: v >= MIN_WORKFLOWS_PER_SECOND
                ),
            ),
            Target(
                "share_of_bare_engine",
                f">= {MIN_SHARE_OF_BARE_ENGINE:.0%} of the bare engine's workflows/s (2 workers)",
                _share_of_bare_engine,
            ),
            Target(
                "commits_per_workflow",
                f"<= {MAX_COMMITS_PER_WORKFLOW:.0f} commits per 3-activity workflow (worst worker count)",
                measured(
                    lambda r: max((row["commits_per_workflow"] for row in r.get("throughput") or []), default=None),
                    lambda v: v <= MAX_COMMITS_PER_WORKFLOW,
                ),
            ),
            Target(
                "commit_rate_share_of_pgbench",
                f"workflows/s x commits/workflow >= {MIN_SHARE_OF_PGBENCH:.0%} of pgbench -N TPS (2 workers)",
                _commit_rate_share_of_pgbench,
            ),
            Target(
                "throughput_rises_with_workers",
                f"each added worker count gains >= {MIN_SCALING_GAIN - 1:.0%} workflows/s "
                f"unless the CPUs were already >= {SATURATED_CPU_SHARE:.0%} busy",
                _rises_with_workers,
            ),
        ),
    ),
    Section(
        "result",
        "result_latency",
        _result,
        (
            Target(
                "result_p50_ms",
                f"start -> result p50 <= {MAX_RESULT_P50_MS:.0f} ms (one caller at a time)",
                most(MAX_RESULT_P50_MS, "result_latency", "sequential", "p50_ms"),
            ),
            Target(
                "result_p99_ms",
                f"start -> result p99 <= {MAX_RESULT_P99_MS:.0f} ms (one caller at a time)",
                most(MAX_RESULT_P99_MS, "result_latency", "sequential", "p99_ms"),
            ),
            Target(
                "commits_per_sequential_workflow",
                f"<= {MAX_COMMITS_PER_SEQUENTIAL_WORKFLOW:.0f} commits per sequential workflow with 2 workers",
                most(MAX_COMMITS_PER_SEQUENTIAL_WORKFLOW, "result_latency", "commits_per_sequential_workflow"),
            ),
        ),
    ),
    Section(
        "event",
        "event_latency",
        _event,
        (
            Target(
                "event_p99_ms",
                f"event POST -> resumed activity p99 < {MAX_EVENT_P99_MS:.0f} ms",
                below(MAX_EVENT_P99_MS, "event_latency", "p99_ms"),
            ),
        ),
    ),
    Section(
        "stream",
        "stream_latency",
        _stream,
        (  # issue 34: an entry reaches an SSE reader fast, and many readers share one listener
            Target(
                "stream_p99_ms",
                f"stream entry written -> SSE event p99 <= {MAX_STREAM_P99_MS:.0f} ms (one stream)",
                most(MAX_STREAM_P99_MS, "stream_latency", "one", "p99_ms"),
            ),
            Target(
                "stream_readers_one_listener",
                "the readers of one stream cost the ingress one database listener",
                measured(_stream_readers, lambda v: v["listeners"] == 1),
            ),
        ),
    ),
    Section(
        "timer",
        "timer_lateness",
        _timer,
        (
            Target(
                "timer_p99_ms",
                f"timer lateness p99 < {MAX_TIMER_P99_MS:.0f} ms",
                below(MAX_TIMER_P99_MS, "timer_lateness", "p99_ms"),
            ),
            Target(
                "timer_never_early",
                "no timer fired before its due time",
                measured(lambda r: at(r, "timer_lateness", "early"), lambda v: v == 0),
            ),
        ),
    ),
    Section(
        "ingress",
        "ingress",
        _ingress,
        (
            Target(
                "ingress_events_per_second",
                f">= {MIN_INGRESS_PER_SECOND:.0f} events/s accepted by the ingress",
                least(MIN_INGRESS_PER_SECOND, "ingress", "events_per_second"),
            ),
            Target(
                "ingress_share_of_insert_limit",
                f"ingress >= {MIN_SHARE_OF_INSERT_LIMIT:.0%} of the single-row insert limit",
                least(MIN_SHARE_OF_INSERT_LIMIT, "ingress", "share_of_insert_limit"),
            ),
        ),
    ),
    Section(
        "scale",
        "scale",
        _scale,
        (
            Target(
                "flat_at_scale",
                f"tables loaded: claim time <= +{MAX_LOADED_CLAIM_DELTA_MS:.0f} ms and workflows/s "
                f">= {MIN_LOADED_THROUGHPUT_SHARE:.0%} of empty tables' (same run)",
                _flat_at_scale,
            ),
        ),
    ),
    Section(
        "long",
        "long",
        _long,
        (
            Target(
                "linear_long_activities",
                f"ms per activity, long over short workflow <= {MAX_GROWTH_RATIO}",
                most(MAX_GROWTH_RATIO, "long", "growth_ratio"),
            ),
        ),
    ),
    Section(
        "events-long",
        "events_long",
        _events_long,
        (
            Target(
                "linear_long_events",
                f"ms per awaited event, long over short chain <= {MAX_GROWTH_RATIO}",
                most(MAX_GROWTH_RATIO, "events_long", "growth_ratio"),
            ),
        ),
    ),
    Section(
        "resume",
        "resume",
        _resume,
        (  # issue 29: with continue_as_new, a resume late in a long loop costs what one early does
            Target(
                "flat_resume_with_continue_as_new",
                f"resume late over early in a continue_as_new loop <= {MAX_GROWTH_RATIO}",
                most(MAX_GROWTH_RATIO, "resume", "with_continue_as_new", "late_over_early"),
            ),
        ),
    ),
    Section("queued", "queued", _queued),
    Section(
        "recovery",
        "recovery",
        _recovery,
        (
            Target(
                "recovery_within_bound",
                "a killed worker's in-flight instances all finish within lease + poll + run time after the kill",
                measured(
                    fields("recovery", "recovery_seconds", "bound_seconds", "taken_over_at_once"),
                    lambda v: v["recovery_seconds"] <= v["bound_seconds"],
                ),
            ),
        ),
    ),
    Section("relay", "relay", _relay),
    Section("failover", "failover", _failover),
    Section(
        "agent",
        "agent",
        _agent,
        (  # issue 34: a durable agent step costs at most this much beyond the bare agent's
            Target(
                "agent_ms_per_step",
                f"Kenning's own time per agent step <= {MAX_AGENT_MS_PER_STEP:.0f} ms (events streamed)",
                most(MAX_AGENT_MS_PER_STEP, "agent", "kenning_ms_per_step_with_events"),
            ),
        ),
    ),
    Section("encryption", "encryption", _encryption),
    Section(
        "offload",
        "offload",
        _offload,
        (
            Target(
                "offload_memory_multiple",
                f"a worker storing and loading a large value peaks at <= {MAX_OFFLOAD_MEMORY_MULTIPLE:.0f}x the value "
                "above its idle memory",
                most(MAX_OFFLOAD_MEMORY_MULTIPLE, "offload", "largest_multiple"),
            ),
        ),
    ),
    Section(
        "flow",
        "flow",
        _flow,
        (  # issue 35: a busy key starts at its RateLimit's pace; each burst is one instance, released promptly
            Target(
                "key_rate_pace",
                f"starts of a rate-limited key >= {KEY_RATE_PACE:.0%} of its limit, no window over it",
                measured(
                    fields("flow_key_rate", "pace", "most_in_a_window", "limit", "quiet_waited_ms"),
                    lambda v: (v["pace"] or 0) >= KEY_RATE_PACE and v["most_in_a_window"] <= v["limit"],
                ),
            ),
            Target(
                "flow_instances_exact",
                "debounced bursts: instances per key exactly as expected, every start folded once",
                measured(lambda r: at(r, "flow", "exact"), bool),
            ),
            Target(
                "flow_release_p99",
                f"quiet period's end to the instance's start p99 <= {MAX_FLOW_RELEASE_P99_MS:g} ms",
                most(MAX_FLOW_RELEASE_P99_MS, "flow", "release_delay", "p99_ms"),
            ),
        ),
    ),
)
TARGETS: tuple[Target, ...] = tuple(target for section in TABLE for target in section.targets)
