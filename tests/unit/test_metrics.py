"""Metrics without a process: ``kenning up`` gives every process a metrics port, and every
metric is in the operations guide. The processes serving them: ``tests/system/test_metrics.py``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kenning import App
from kenning_devtools.up import main as up
from tests.support import REPO_ROOT


def test_up_gives_every_process_a_metrics_port_and_prints_where(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    args = parser.parse_args(["--workers", "2", "--metrics-port", "9400"])
    ports = up._metrics_ports(args)
    assert ports == {"scheduler": 9400, "relayer": 9401, "worker-1": 9402, "worker-2": 9403}
    for spec in up._children(args, App(), tmp_path, ports):
        if spec.name in ports:
            assert spec.args[spec.args.index("--metrics-port") + 1] == str(ports[spec.name]), spec
    urls = up._metrics_urls("http://127.0.0.1:8000", ports)
    assert urls[0] == "ingress http://127.0.0.1:8000/metrics" and "worker-2 http://127.0.0.1:9403/metrics" in urls
    free = up._metrics_ports(parser.parse_args(["--workers", "1"]))  # 0: ports the system has free
    assert len(set(free.values())) == 3 and all(free.values())


def test_every_metric_is_in_the_operations_guide() -> None:
    """docs/operations.md's tables name every metric ``kenning.observability.metrics`` defines."""
    defined = set(
        re.findall(r'"(kenning_[a-z_]+)"', (REPO_ROOT / "shared/kenning/observability/metrics.py").read_text())
    )
    guide = (REPO_ROOT / "docs/operations.md").read_text()
    assert len(defined) > 20, defined  # the pattern still finds them
    assert sorted(name for name in defined if f"`{name}`" not in guide) == []
