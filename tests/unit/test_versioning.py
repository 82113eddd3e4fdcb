"""``@workflow(versioning=...)`` (docs/operations.md#version-pinning): checked when the
workflow is declared, so a typo never reaches a deploy as an instance no worker runs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kenning import ConfigurationError, WorkflowContext, workflow
from kenning.hosting.presence import code_version
from kenning.registry import REGISTRY
from kenning.workflow import Workflow


async def _ship(ctx: WorkflowContext, parcel: str) -> str:
    return parcel


def test_auto_upgrade_is_the_default_and_pinned_is_kept() -> None:
    assert Workflow(_ship, name="v.default").versioning == "auto_upgrade"
    assert Workflow(_ship, name="v.auto", versioning="auto_upgrade").versioning == "auto_upgrade"
    assert Workflow(_ship, name="v.pinned", versioning="pinned").versioning == "pinned"


@pytest.mark.parametrize("given", ["Pinned", "pin", "latest", "", None, True, 1])
def test_an_unknown_versioning_is_refused_when_the_workflow_is_declared(given: Any) -> None:
    message = f"workflow 'v.bad': versioning= must be one of 'auto_upgrade', 'pinned', not {given!r}"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        workflow(name="v.bad", versioning=given)(_ship)
    assert "v.bad" not in REGISTRY.workflows  # refused before it was registered


def test_the_code_version_follows_the_workflows_code_not_their_versioning() -> None:
    # a worker's version is its workflows' fingerprint: the same code is the same version
    # on every worker, and a change to any workflow's source makes another one
    one = Workflow(_ship, name="v.ship")
    same = Workflow(_ship, name="v.ship", versioning="pinned")
    assert code_version({"v.ship": one.source_hash}) == code_version({"v.ship": same.source_hash})
    assert code_version({"v.ship": one.source_hash}) != code_version({"v.ship": "another source"})
