"""deploy/prometheus's alert rules, checked by Prometheus's own ``promtool`` (Debian's
``prometheus`` package; .ci/run installs it): the rules parse, and their unit tests
(``alerts_test.yml``: each alert fires on its figures and stays quiet on the others) pass."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import REPO_ROOT

RULES = REPO_ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=120)


def test_the_alert_rules_and_the_scrape_configuration_pass_promtool_check() -> None:
    rules = promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_alert_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
