"""The benchmark's table: each result beside the limit it is measured against."""

from __future__ import annotations

from typing import Any


def _ratio(value: float | None, limit: float | None) -> str:
    if not value or not limit:
        return "-"
    return f"{100 * value / limit:.0f}%"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Kenning benchmark ({report['configuration']}, {report['machine']['cpus']} CPUs, "
        f"{report['duration_seconds']} s)"
    ]
    lim = report.get("limits") or {}
    bare = (lim.get("bare_engine") or {}).get("workflows_per_second")
    pgbench = lim.get("pgbench_tps")
    if lim:
        lines += [
            "",
            f"limits ({lim['clients']} clients): pgbench -N {pgbench} TPS; single-row insert "
            f"{lim['insert_per_second']}/s; bare engine {bare:.0f} wf/s at "
            f"{lim['bare_engine']['commits_per_workflow']:.2f} commits/wf",
        ]
    rows = report.get("throughput") or []
    if rows:
        lines += [
            "",
            "workers  wf/s    steps/s  commits/wf  worker CPU ms/wf  PG CPU ms/wf  vs bare  commit rate vs pgbench",
        ]
        for r in rows:
            commit_rate = r["workflows_per_second"] * r["commits_per_workflow"]
            lines.append(
                f"{r['workers']:>7}  {r['workflows_per_second']:>6}  {r['steps_per_second']:>7}  "
                f"{r['commits_per_workflow']:>10}  {r['worker_cpu_ms_per_workflow']:>16}  "
                f"{r['postgres_cpu_ms_per_workflow'] or '-':>12}  {_ratio(r['workflows_per_second'], bare):>7}  "
                f"{_ratio(commit_rate, pgbench):>6}"
            )
    for key, label in (("event_latency", "event POST -> next activity"), ("timer_lateness", "timer lateness")):
        section = report.get(key)
        if section:
            lines += ["", f"{label}: " + ", ".join(f"{k} {v}" for k, v in section.items())]
    ingress = report.get("ingress")
    if ingress:
        lines += [
            "",
            f"ingress: {ingress.get('events_per_second')} events/s, p99 {ingress.get('p99_ms')} ms, "
            f"{_ratio(ingress.get('events_per_second'), lim.get('insert_per_second'))} of the insert limit",
        ]
    sc = report.get("scale")
    if sc:
        lines += [
            "",
            f"scale: claim {sc['claim_empty']['claim_ms_median']} ms empty -> {sc['claim_loaded']['claim_ms_median']} "
            f"ms with {sc['finished_instances']} finished + {sc['waiting_instances']} waiting "
            f"(partial index: {sc['claim_loaded']['uses_partial_index']}); throughput then "
            f"{sc['throughput_loaded']['workflows_per_second']} wf/s",
        ]
    lg = report.get("long")
    if lg:
        lines += [
            "",
            f"long workflows: ms per step {lg['ms_per_step']}, growth ratio {lg['growth_ratio']} (1.0 = linear)",
        ]
    return "\n".join(lines)
