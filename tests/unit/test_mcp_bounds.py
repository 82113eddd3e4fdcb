"""``kenning mcp``'s answers are bounded (``kenning.assistant.operations.bounded``): an
answer over the byte cap has its longest list halved until it fits, with a note saying
what was cut and how to ask for the rest; one value too long alone is cut to its start."""

from __future__ import annotations

import json

from kenning.assistant.operations import bounded


def test_a_small_answer_is_whole() -> None:
    answer = {"instances": [{"id": "a"}], "next_cursor": None}
    assert json.loads(bounded(answer)) == answer


def test_the_longest_list_is_halved_until_the_answer_fits() -> None:
    rows = [{"id": f"order-{n}", "note": "x" * 900} for n in range(100)]
    text = bounded({"instances": rows, "actions": [{"id": 1}], "next_cursor": "c"}, limit=10_000)
    assert len(text.encode()) <= 10_000
    answer = json.loads(text)
    kept = len(answer["instances"])
    assert 0 < kept < 100 and answer["instances"] == rows[:kept]
    assert answer["actions"] == [{"id": 1}] and answer["next_cursor"] == "c"
    assert f"{kept} of 100 instances shown" in answer["truncated"] and "limit" in answer["truncated"]


def test_one_value_too_long_alone_is_cut_to_its_start() -> None:
    text = bounded({"why": "y" * 50_000}, limit=4_000)
    assert len(text.encode()) <= 4_000
    answer = json.loads(text)
    assert "over 4000" in answer["truncated"] and answer["text"].startswith('{"why": "yyy')
