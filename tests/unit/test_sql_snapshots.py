"""Every storage statement, readable as one text (issue 26, item 3; issue 38, item 7):
``shared/kenning/storage/sql/`` holds each as PostgreSQL receives it, the fenced writes
first. A change to a statement without its snapshot regenerated fails here, so a reviewer
always reads the SQL that runs; a statement added anywhere in ``kenning.storage`` is found
without being listed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kenning.db import Statement
from kenning_devtools import sqlsnapshots
from kenning_devtools.sqlsnapshots import COMMAND, EXEMPT, FOLDER, composing_functions, group_of, rendered

SNAPSHOTS = rendered()


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_each_checked_in_statement_is_the_one_that_runs(name: str) -> None:
    path = FOLDER / name
    assert path.exists(), f"{name} is missing; regenerate: {COMMAND}"
    assert path.read_text() == SNAPSHOTS[name], f"{name} is stale; regenerate: {COMMAND}"


def test_no_snapshot_is_left_of_a_statement_that_is_gone() -> None:
    on_disk = sorted(str(p.relative_to(FOLDER)) for p in FOLDER.rglob("*") if p.is_file())
    assert on_disk == sorted(SNAPSHOTS), f"regenerate: {COMMAND}"


def test_every_module_level_statement_of_storage_has_its_file() -> None:
    """Counted from the modules' values, apart from the generator's reading of their source."""
    expected = 0
    for module in sqlsnapshots.storage_modules():
        for value in vars(module).values():
            if isinstance(value, Statement):
                expected += 1
            elif isinstance(value, dict) and value and all(isinstance(v, Statement) for v in value.values()):
                expected += len(value)
    statements = [n for n in SNAPSHOTS if n.endswith(".sql")]
    variants = sum(len(v) for v in sqlsnapshots._variants().values())
    assert len(statements) == expected + variants > 200


def test_a_function_composing_its_statement_is_rendered_or_exempt() -> None:
    """A factory added in a branch fails here until its variants are named in ``_VARIANTS``
    (or it is exempted with its reason)."""
    composing = composing_functions(sqlsnapshots.storage_modules())
    named = set(sqlsnapshots._variants()) | set(EXEMPT)
    assert composing - named == set(), "name their variants in kenning_devtools.sqlsnapshots._variants"
    assert named - composing == set(), "no longer composing: drop them from _variants or EXEMPT"


def test_a_new_statement_in_a_storage_module_is_found(tmp_path: Path) -> None:
    source = tmp_path / "planted.py"
    source.write_text(
        "from kenning.db import statement\n\n"
        "# why it exists\n"
        "_PLANTED_MARK = statement(\n"
        "    'UPDATE kenning_instances SET status = :s WHERE id = :id AND lease_token = CAST(:token AS uuid)'\n"
        ")\n\n"
        "async def planted_mark(conn):\n    await conn.execute(_PLANTED_MARK, {})\n"
    )
    spec = importlib.util.spec_from_file_location("kenning.storage.planted", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        (found,) = sqlsnapshots.module_snapshots(module)
    finally:
        sys.modules.pop("kenning.storage.planted", None)
    assert (found.path, found.used_by, found.what) == (
        "1_fenced/planted.planted_mark.sql",
        ("planted_mark",),
        "why it exists",
    )
    assert "WHERE id = :id AND lease_token = CAST(:token AS uuid)" in found.text()


@pytest.mark.parametrize(
    ("sql", "group"),
    [
        ("UPDATE t SET a = 1 WHERE id = :id AND lease_token = CAST(:token AS uuid)", "1_fenced"),
        ("UPDATE t SET a = 1 WHERE lease_token = ANY(CAST(:tokens AS uuid[]))", "1_fenced"),
        (
            "WITH w AS (SELECT 1) UPDATE t AS i SET a = 1 FROM w WHERE i.id = w.id AND i.lease_token = w.token",
            "1_fenced",
        ),
        ("UPDATE t SET lease_token = CAST(:token AS uuid) WHERE id = :id", "2_writes"),  # a claim gives it out
        ("SELECT id FROM t WHERE lease_token = CAST(:token AS uuid) FOR UPDATE", "3_reads"),
        ("SELECT id FROM t FOR NO KEY UPDATE SKIP LOCKED -- UPDATE x", "3_reads"),
        ("DELETE FROM t WHERE id = :id", "2_writes"),
    ],
)
def test_the_groups(sql: str, group: str) -> None:
    assert group_of(sql) == group


def test_the_fenced_writes_come_first_in_the_index() -> None:
    index = SNAPSHOTS["README.md"]
    assert index.index("## Fenced writes") < index.index("## Other writes") < index.index("## Reads")
    assert "1_fenced/writes.writes_apply.sql" in SNAPSHOTS and "1_fenced/instances.instance_heartbeat.sql" in SNAPSHOTS
    assert "2_writes/claims.instance_claim.sql" in SNAPSHOTS  # a claim fences nothing: it hands out the token
    for path in (p for p in SNAPSHOTS if p.endswith(".sql")):
        assert f"]({path})" in index, path


def test_the_claim_reads_as_one_statement_with_its_lease() -> None:
    claim = SNAPSHOTS["2_writes/claims.instance_claim.sql"]
    assert "FOR UPDATE SKIP LOCKED" in claim and "gen_random_uuid()" in claim and "%(" not in claim
    assert claim.startswith("-- kenning.storage.claims: instance_claim\n")
    heartbeat = SNAPSHOTS["1_fenced/instances.instance_heartbeat.sql"]
    assert heartbeat.startswith("-- kenning.storage.instances: instance_heartbeat\n-- run by instance_heartbeat()\n")
