"""``kenning bench --sections failover`` runs as the report says: a primary lost under
pg_auto_failover, the standby promoted, the workers on the multi-host URL carry on and
nothing started is lost. (Its figures are the bench's to report, never asserted here.)"""

from __future__ import annotations

import pytest

from kenning_devtools import autofailover
from kenning_devtools.bench.failover import run_failover
from kenning_devtools.bench.main import section_list
from tests.support import free_port

pytestmark = [
    pytest.mark.skipif(autofailover.missing() is not None, reason=str(autofailover.missing())),
    pytest.mark.serial,  # three PostgreSQL servers and a monitor with one-second health checks
]


async def test_the_failover_section_loses_nothing_and_reports_each_interval() -> None:
    assert section_list("failover") == ["failover"]  # a section of kenning bench, run when named
    run = await run_failover((free_port(), free_port(), free_port()))
    assert "skipped" not in run, run
    assert run["lost"] == 0, run
    assert run["started_before_kill"] >= 40 and run["started"] > run["started_before_kill"], run
    for measure in ("kill_to_promotion", "promotion_to_first_step", "promotion_to_in_flight_done"):
        assert run[f"{measure}_seconds"] >= 0, run
