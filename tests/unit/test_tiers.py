"""The suite's tiers (``tests/tiers.py``): every test module sits in one tier's folder, each
test carries its folder's mark, and the marks are registered (``--strict-markers``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiers


def test_every_test_module_sits_in_a_tier_folder() -> None:
    outside = sorted(
        path.relative_to(tiers.TESTS).as_posix()
        for path in tiers.TESTS.rglob("test_*.py")
        if tiers.tier_of(path) is None
    )
    assert outside == [], f"test modules outside tests/unit, tests/integration and tests/system: {outside}"


def test_a_test_carries_its_folders_mark(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert not any(request.node.get_closest_marker(tier) for tier in ("integration", "system"))


def test_the_tier_of_a_path_is_its_folder_under_tests() -> None:
    assert tiers.tier_of(tiers.TESTS / "unit" / "test_cron.py") == "unit"
    assert tiers.tier_of(tiers.TESTS / "system" / "test_up.py") == "system"
    assert tiers.tier_of(tiers.TESTS / "integration") == "integration"
    assert tiers.tier_of(tiers.TESTS / "support.py") is None
    assert tiers.tier_of(tiers.TESTS) is None
    assert tiers.tier_of(Path("/elsewhere/unit/test_x.py")) is None


def test_every_tier_is_a_registered_mark(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert set(tiers.TIERS) <= registered
