"""The hot statements, readable as one text (issue 26, item 3): ``shared/kenning/storage/sql/``
holds each as PostgreSQL receives it (the claims are assembled from shared parts in
Python). A change to a statement without its snapshot regenerated fails here, so a
reviewer always reads the SQL that runs."""

from __future__ import annotations

import pytest

from kenning_devtools.sqlsnapshots import FOLDER, rendered

SNAPSHOTS = rendered()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_each_checked_in_statement_is_the_one_that_runs(name: str) -> None:
    path = FOLDER / name
    assert path.exists(), f"{name} is missing: python -m kenning_devtools.sqlsnapshots"
    assert path.read_text() == SNAPSHOTS[name], f"{name} is stale: python -m kenning_devtools.sqlsnapshots"


def test_no_snapshot_is_left_of_a_statement_that_is_gone() -> None:
    assert sorted(p.name for p in FOLDER.glob("*.sql")) == sorted(SNAPSHOTS)


def test_the_claim_reads_as_one_statement_with_its_lease() -> None:
    claim = SNAPSHOTS["claim.sql"]
    assert "FOR UPDATE SKIP LOCKED" in claim and "gen_random_uuid()" in claim and "%(" not in claim
