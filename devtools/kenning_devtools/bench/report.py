"""The benchmark's table: each section that ran (``sections.TABLE``, in its order), each
result beside the limit it is measured against, then every target and whether this run met it."""

from __future__ import annotations

from typing import Any

from kenning_devtools.bench.sections import TABLE


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
    for section in TABLE:
        results = report.get(section.key)
        if results:  # a section not run prints nothing
            lines += ["", *section.rows(results, report)]
    if report.get("targets"):
        lines += _targets(report["targets"])
    return "\n".join(lines)
