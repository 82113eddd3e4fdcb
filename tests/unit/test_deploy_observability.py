"""deploy/'s Prometheus rules, Grafana dashboard and compose's observability profile:
every metric they name is one Kenning exports, the database gauges are never summed over
processes, and every file the profile mounts exists. ``promtool`` runs the rules' own unit
tests in ``tests/system/test_alert_rules.py``."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from kenning.observability import metrics
from tests.support import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
DEFINED = set(re.findall(r'"(kenning_[a-z_]+)"', (REPO_ROOT / "shared/kenning/observability/metrics.py").read_text()))
EVENT = set(metrics.event_families())
GAUGES = {name for name in DEFINED if name not in EVENT and name.removesuffix("_total") not in EVENT}


def rule_expressions() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((DEPLOY / "grafana" / "dashboards" / "kenning.json").read_text())
    return found


def dashboard_expressions() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def series_names(expression: str) -> set[str]:
    """The Kenning series an expression reads, as exported (histograms' suffixes kept)."""
    return set(re.findall(r"\bkenning_[a-z_]+", expression))


def is_exported(series: str) -> bool:
    if series in DEFINED:
        return True
    for suffix in ("_bucket", "_count", "_sum"):
        if series.endswith(suffix) and series.removesuffix(suffix) in DEFINED:
            return True
    return False


def test_every_series_the_rules_and_the_dashboard_read_is_exported() -> None:
    assert len(GAUGES) > 15 and "kenning_queue_depth" in GAUGES, GAUGES  # the split still finds them
    for where, expressions in (("alerts.yml", rule_expressions()), ("kenning.json", dashboard_expressions())):
        assert expressions, where
        unknown = sorted({s for e in expressions for s in series_names(e) if not is_exported(s)})
        assert unknown == [], f"{where} reads series Kenning does not export: {unknown}"


def test_the_database_gauges_are_never_summed_over_processes() -> None:
    # each scheduler reports the same figure: a sum would count it once per scheduler
    summed = re.compile(r"\bsum\b\s*(?:by\s*\([^)]*\)\s*)?\(\s*(kenning_[a-z_]+)")
    for expression in rule_expressions() + dashboard_expressions():
        for series in summed.findall(expression):
            assert series not in GAUGES, f"a gauge of the database summed: {expression}"


def test_the_dashboard_covers_each_process_and_the_step_metrics_by_workflow() -> None:
    board = dashboard()
    assert board["uid"] == "kenning-overview"
    read = {s for e in dashboard_expressions() for s in series_names(e)}
    for family in ("kenning_step_duration_seconds_bucket", "kenning_runnable_instances", "kenning_queue_depth"):
        assert family in read, family
    for process in metrics.PROCESSES:  # at least one family of each process is on it
        assert any(name.startswith(tuple(metrics.exported_by(process))) for name in read), process
    step_panels = [e for e in dashboard_expressions() if "kenning_step_" in e]
    assert step_panels and all("workflow" in e for e in step_panels), step_panels
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_the_observability_profile_mounts_files_that_exist_and_scrapes_every_process() -> None:
    services = COMPOSE["services"]
    profile = {name for name, service in services.items() if "observability" in service.get("profiles", [])}
    assert profile == {"prometheus", "grafana", "otel-collector"}
    for name in profile:
        for volume in services[name].get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
        assert all(port.startswith("127.0.0.1:") for port in services[name].get("ports", [])), name
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in scrape["scrape_configs"]}
    assert {f"kenning-{process}" for process in metrics.PROCESSES} <= jobs, jobs
    assert scrape["rule_files"] == ["alerts.yml"]  # beside the config, where the profile mounts both
