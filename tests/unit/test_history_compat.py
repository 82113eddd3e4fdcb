"""Histories written before the package was layered still replay (issue 26, item 2).

A failed step stores its exception by dotted class name (``serialization.encode_error``);
replay rebuilds that class. ``tests/fixtures/errors_before_layers.json`` holds errors as
the flat package encoded them (every Kenning exception a history or an instance can hold,
and a cause chain): each must decode to its class, message and cause after any move."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kenning import serialization
from kenning.errors import ReplayedActivityError
from tests.support import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "errors_before_layers.json"
ENCODED: dict[str, dict[str, Any]] = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", sorted(ENCODED))
def test_an_error_encoded_before_the_move_decodes_to_its_class(case: str) -> None:
    encoded = ENCODED[case]
    decoded = serialization.decode_error(encoded)
    assert type(decoded).__name__ == encoded["type"].rsplit(".", 1)[1], encoded
    assert not isinstance(decoded, ReplayedActivityError), f"{encoded['type']} no longer resolves"
    assert str(decoded) == encoded["message"]


def test_a_cause_chain_decodes_whole() -> None:
    decoded = serialization.decode_error(ENCODED["retry_exhausted_by_timeout"])
    assert type(decoded).__name__ == "RetryExhaustedError"
    assert type(decoded.__cause__).__name__ == "ActivityTimeoutError"
    assert str(decoded.__cause__) == "attempt 5 of charge ran past 30 s"
