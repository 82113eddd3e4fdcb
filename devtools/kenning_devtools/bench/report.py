"""The benchmark's table: each result beside the limit it is measured against, then
every target of issue 7 and whether this run met it."""

from __future__ import annotations

from typing import Any


def _ratio(value: float | None, limit: float | None) -> str:
    if not value or not limit:
        return "-"
    return f"{100 * value / limit:.0f}%"


def _limits(lim: dict[str, Any]) -> list[str]:
    bare = lim["bare_engine"]
    return [
        "",
        f"limits ({lim['clients']} clients): pgbench -N {lim['pgbench_tps']} TPS; single-row insert "
        f"{lim['insert_per_second']}/s; bare engine {bare['workflows_per_second']:.0f} wf/s at "
        f"{bare['commits_per_workflow']:.2f} commits/wf",
    ]


def _throughput(rows: list[dict[str, Any]], bare: float | None, pgbench: float | None) -> list[str]:
    lines = [
        "",
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
            f"{_ratio(r.get('machine_cpu_busy'), 1.0):>9}  {_ratio(r['workflows_per_second'], bare):>7}  "
            f"{_ratio(commit_rate, pgbench):>6}"
        )
    return lines


def _latencies(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    machine_cpus = report["machine"]["cpus"]
    result = report.get("result_latency")
    if result:
        seq, conc = result["sequential"], result["concurrent"]
        lines += [
            "",
            f"start -> result ({result['workers']} workers): one caller at a time ({seq['samples']} samples) "
            f"p50 {seq['p50_ms']} ms, p99 {seq['p99_ms']} ms, max {seq['max_ms']} ms, "
            f"{result['commits_per_sequential_workflow']} commits/wf; {conc['callers']} callers at once "
            f"({conc['samples']} samples) p50 {conc['p50_ms']} ms, p99 {conc['p99_ms']} ms, max {conc['max_ms']} ms",
        ]
    event = report.get("event_latency")
    if event:
        post = event["post_response"]
        lines += [
            "",
            f"event POST -> next activity ({event['samples']} samples): p50 {event['p50_ms']} ms, "
            f"p99 {event['p99_ms']} ms, max {event['max_ms']} ms (POST answered: p50 {post['p50_ms']} ms, "
            f"p99 {post['p99_ms']} ms)",
        ]
    stream = report.get("stream_latency")
    if stream:
        beside = stream.get("event_latency") or report.get("event_latency")
        runs = [("1 stream", stream["one"]), (f"{stream['many']['streams']} streams", stream["many"])]
        runs.append((f"1 stream, {stream['readers']['readers']} readers", stream["readers"]))
        lines += ["", f"stream entry written -> SSE event (an entry every {stream['interval_seconds']} s per stream):"]
        lines += [
            f"  {name}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms ({r['samples']} samples, "
            f"{r['entries_per_second']} entries/s, {r['ingress_listeners']} ingress listener(s))"
            for name, r in runs
        ]
        if beside:
            lines.append(
                f"  beside the event latency of this run: p50 {beside['p50_ms']} ms, p99 {beside['p99_ms']} ms"
            )
    timer = report.get("timer_lateness")
    if timer:
        lines += [
            "",
            f"timer lateness ({timer['samples']} timers of {timer['timer_seconds']} s): p50 {timer['p50_ms']} ms, "
            f"p99 {timer['p99_ms']} ms, max {timer['max_ms']} ms, min {timer['min_ms']} ms, early {timer['early']}",
        ]
    ingress = report.get("ingress")
    if ingress:
        cpu = ingress["cpu_ms_per_event"]
        lines += [
            "",
            f"ingress ({ingress['clients']} clients, {ingress['ingress_workers']} uvicorn workers, "
            f"{ingress['seconds']} s): {ingress['events_per_second']} events/s, "
            f"{_ratio(ingress['events_per_second'], ingress['insert_limit_per_second'])} of the insert limit "
            f"({ingress['insert_limit_per_second']}/s); response p50 {ingress['response_p50_ms']} ms, "
            f"p99 {ingress['response_p99_ms']} ms; {ingress['rejected']} not accepted",
            f"  CPU ms per event: ingress {cpu['ingress']}, load client {cpu['client']}, "
            f"PostgreSQL backends {cpu['postgres_backends']}; "
            f"{ingress['new_database_sessions']} database connections opened meanwhile; ingress + PostgreSQL "
            f"CPU alone would allow {ingress['server_cpu_capacity_per_second']} events/s on {machine_cpus} CPUs",
        ]
    return lines


def _shapes(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    sc = report.get("scale")
    if sc:
        lines += [
            "",
            f"scale: claim {sc['claim_empty']['claim_ms_median']} ms empty -> {sc['claim_loaded']['claim_ms_median']} "
            f"ms with {sc['finished_instances']} finished + {sc['waiting_instances']} waiting "
            f"(partial index: {sc['claim_loaded']['uses_partial_index']}); "
            f"{sc['throughput_loaded']['workers']} workers: {sc['throughput_loaded']['workflows_per_second']} wf/s "
            f"loaded vs {sc['throughput_empty']['workflows_per_second']} empty = {sc['throughput_share']:.0%} "
            f"(rounds: {', '.join(f'{s:.0%}' for s in sc['round_shares'])})",
        ]
    lg = report.get("long")
    if lg:
        lines += [
            "",
            f"long workflows: ms per step {lg['ms_per_step']}, growth ratio {lg['growth_ratio']} (1.0 = linear)",
        ]
    chain = report.get("events_long")
    if chain:
        lines += [
            "",
            f"event chains: total s {chain['events']}, ms per event from the first wait {chain['ms_per_event']}, "
            f"growth ratio {chain['growth_ratio']} (1.0 = linear)",
        ]
    rs = report.get("resume")
    if rs:
        cont, plain = rs["with_continue_as_new"], rs["without"]
        lines += [
            "",
            f"resume after {rs['steps']} steps: with continue_as_new every {rs['continue_every']} "
            f"{cont['resume_ms_early']} -> {cont['resume_ms_late']} ms (x{cont['late_over_early']}); "
            f"without {plain['resume_ms_early']} -> {plain['resume_ms_late']} ms (x{plain['late_over_early']})",
        ]
    return lines


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(
            f"{k} {_value(v) if not isinstance(v, dict) else '(' + _value(v) + ')'}" for k, v in value.items()
        )
    return str(value)


def _targets(found: dict[str, Any]) -> list[str]:
    lines = ["", "targets (issues 7, 15 and 25)"]
    for name, t in found.items():
        verdict = {True: "met", False: "MISSED", None: "not run"}[t["met"]]
        lines.append(f"  {verdict:<7}  {name}: {t['target']} (this run: {_value(t['value'])})")
    return lines


def render(report: dict[str, Any]) -> str:
    machine = report["machine"]
    lines = [
        f"Kenning benchmark ({report['configuration']}, {machine['cpus']} CPUs, "
        f"{report['duration_seconds']} s, load average {machine.get('load_average_at_start')} at start)"
    ]
    lim = report.get("limits") or {}
    if lim:
        lines += _limits(lim)
    rows = report.get("throughput") or []
    if rows:
        bare = (lim.get("bare_engine") or {}).get("workflows_per_second")
        lines += _throughput(rows, bare, lim.get("pgbench_tps"))
    lines += (
        _latencies(report) + _shapes(report) + _queued(report) + _recovery(report) + _relay(report) + _failover(report)
    )
    lines += _agent(report) + _encryption(report) + _offload(report)
    lines += _flow(report) + _console(report)
    if report.get("targets"):
        lines += _targets(report["targets"])
    return "\n".join(lines)


def _console(report: dict[str, Any]) -> list[str]:
    """The console section: browsers watching one busy instance, what they cost the console."""
    section = report.get("console")
    if not section:
        return []
    lines = [
        "",
        f"Console (one busy instance, a {section['pause_seconds']} s timer a step; {section['console_code']}):",
    ]
    for run in section["watchers"].values():
        lines.append(
            f"  {run['watchers']} watching: {run['statements_per_second']} statements/s, "
            f"{run['console_cpu_percent']}% of a CPU, {run['pages_per_second']} pages/s, "
            f"{run['statements_per_page']} statements and {run['console_cpu_ms_per_page']} CPU ms a page"
        )
    return lines


def _encryption(report: dict[str, Any]) -> list[str]:
    """The encryption section: the throughput run plaintext and sealed, the cost as ratios."""
    section = report.get("encryption")
    if not section:
        return []
    off, on, ratio = section["off"], section["on"], section["on_to_off"]
    return [
        "",
        f"Encryption ({section['workflows']} workflows, {section['workers']} worker, AES-256-GCM on every payload): "
        f"worker CPU {off['worker_cpu_ms_per_workflow']} -> {on['worker_cpu_ms_per_workflow']} ms/workflow "
        f"(x{ratio['worker_cpu_ms_per_workflow']}), client CPU x{ratio['client_cpu_ms_per_workflow']}, "
        f"workflows/s {off['workflows_per_second']} -> {on['workflows_per_second']} "
        f"(x{ratio['workflows_per_second']}); seal and open one payload "
        f"{section['seal_and_open_microseconds_per_payload']} us",
    ]


def _offload(report: dict[str, Any]) -> list[str]:
    """The offload section: a worker storing and loading values through the object store."""
    section = report.get("offload")
    if not section:
        return []
    lines = ["", "offload (a worker stores a value in the object store, another's replay loads it back):"]
    for name, run in section.items():
        if isinstance(run, dict):
            lines.append(
                f"  {name:>6}: store {run['store_seconds']} s at {run['store_above_idle_per_value']}x, "
                f"load {run['load_seconds']} s at {run['load_above_idle_per_value']}x the value above idle; "
                f"worker peak {run['worker_peak_mb']} MB (idle {run['worker_idle_mb']} MB)"
            )
    return lines


def _agent(report: dict[str, Any]) -> list[str]:
    """The agent section: the same agent bare and durable, Kenning's time per step."""
    section = report.get("agent")
    if not section:
        return []
    if "skipped" in section:
        return ["", f"agent: skipped, {section['skipped']}"]
    bare, events, quiet = section["bare"], section["durable_with_events"], section["durable_without_events"]
    return [
        "",
        f"agent ({section['steps_per_run']} steps a run, one run at a time, {bare['samples']} runs each): "
        f"bare p50 {bare['p50_ms']} ms, {section.get('bare_with_events', {}).get('p50_ms')} ms with an event "
        f"handler; durable p50 {events['p50_ms']} ms with its event stream, "
        f"{quiet['p50_ms']} ms without; Kenning's own time per step {section['kenning_ms_per_step_with_events']} ms "
        f"with events, {section['kenning_ms_per_step_without_events']} ms without",
        *_agent_floor(section),
    ]


def _agent_floor(section: dict[str, Any]) -> list[str]:
    """What a step costs beside the floor of the same run: one commit (older reports lack it)."""
    if "commit" not in section:
        return []
    return [
        f"  a commit on its own (the floor of a step) p50 {section['commit']['p50_ms']} ms; per step "
        f"{section['per_step_over_commit_with_events']} / {section['per_step_over_commit_without_events']} "
        f"commits' time, {section['commits_per_step_with_events']} / {section['commits_per_step_without_events']} "
        f"commits, Kenning's CPU {section['kenning_cpu_ms_per_step_with_events']} / "
        f"{section['kenning_cpu_ms_per_step_without_events']} ms (with / without events)",
    ]


def _flow(report: dict[str, Any]) -> list[str]:
    """The flow section: keyed bursts of debounced starts, the instances they made, the release delay."""
    flow = report.get("flow")
    if not flow:
        return []
    delay = flow["release_delay"] or {}
    return [
        "",
        f"Debounced bursts ({flow['starts']} starts over {flow['keys']} keys, {flow['bursts_per_key']} bursts of "
        f"{flow['starts_per_burst']} per key, {flow['starts_per_second']} starts/s, period {flow['period_seconds']} s)",
        f"  instances {flow['instances']} of {flow['instances_expected']} expected, keys off count "
        f"{flow['keys_with_other_counts']}, starts folded {flow['starts_folded']}: "
        f"{'exact' if flow['exact'] else 'NOT EXACT'}",
        f"  quiet period's end to the instance's start: p50 {delay.get('p50_ms')} ms, p99 {delay.get('p99_ms')} ms, "
        f"max {delay.get('max_ms')} ms, min {delay.get('min_ms')} ms",
    ]


def _queued(report: dict[str, Any]) -> list[str]:
    """The queued section: one row per mode (no queue, a queue, a queue with limits on)."""
    queued = report.get("queued")
    if not queued:
        return []
    lines = [
        "",
        f"Queued throughput ({queued['workflows']} workflows, {queued['workers']} workers, "
        f"limits on: concurrency {queued['limited_concurrency']}, 64 partitions of at most 4)",
    ]
    for run in queued["runs"]:
        lines.append(
            f"  {run['mode']:<18} {run['workflows_per_second']:>8} workflows/s  "
            f"{run['worker_cpu_ms_per_workflow']:>7} worker CPU ms/workflow"
        )
    return lines


def _recovery(report: dict[str, Any]) -> list[str]:
    """The recovery section: a killed worker's instances, finished by an idle one."""
    rec = report.get("recovery")
    if not rec:
        return []
    return [
        "",
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


def _failover(report: dict[str, Any]) -> list[str]:
    """The failover section: a primary lost under pg_auto_failover, the standby promoted."""
    run = report.get("failover")
    if not run:
        return []
    if "skipped" in run:
        return ["", f"failover skipped: {run['skipped']}"]
    return [
        "",
        f"failover (pg_auto_failover, primary killed, {run['started']} workflows started through the multi-host URL, "
        f"poll {run['poll_seconds']} s, lease {run['lease_seconds']} s): promoted "
        f"{run['kill_to_promotion_seconds']} s after the kill; first step on the new primary "
        f"{run['promotion_to_first_step_seconds']} s after the promotion; the {run['started_before_kill']} started "
        f"before it all done {run['promotion_to_in_flight_done_seconds']} s after it; lost {run['lost']}",
    ]


def _relay(report: dict[str, Any]) -> list[str]:
    """The relay section: per target, what crashing relayers delivered."""
    relay = report.get("relay")
    if not relay:
        return []
    lines = [
        "",
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
