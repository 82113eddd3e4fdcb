"""The targets of issues 7, 15, 25, 29, 34, 35 and 36 (declared with their sections in
``sections.TABLE``), each checked against this run's own measurements (never typed in):
``{"target": what it asks, "value": what this run measured, "met": True/False, or None
when the sections it needs were not run}``."""

from __future__ import annotations

from typing import Any

from kenning_devtools.bench.sections import TARGETS


def evaluate(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every target against ``report`` (the sections this run measured), in the table's order."""
    found = {}
    for target in TARGETS:
        value, met = target.judge(report)
        found[target.name] = {"target": target.text, "value": value, "met": met}
    return found
