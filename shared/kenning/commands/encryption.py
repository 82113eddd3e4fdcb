"""``kenning encryption rotate|new-key``: payload encryption's operator commands.

``rotate`` rewrites, in batches, every stored payload not sealed under the first key of
``KENNING_ENCRYPTION_KEYS`` (sealed under an older key, or written plain before encryption
was on) so that it is; run it after putting a new key first, then drop the old keys. It is
idempotent and safe while workers run: each batch locks its rows as their other writes do.
``new-key ID`` prints a fresh ``ID:<base64>`` entry to put first in the variable.
"""

from __future__ import annotations

import argparse
import asyncio

from kenning import codecs
from kenning.commands.output import emit, emit_json, table
from kenning.db import Database, connect
from kenning.errors import UsageError
from kenning.hosting.config import add_database_options, add_logging_options
from kenning.objects.offload import has_references
from kenning.storage import encryption as encryption_sql

HELP = "re-encrypt stored payloads under the first KENNING_ENCRYPTION_KEYS key (rotate), or make a key (new-key)"


def _batch_size(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    rotate = actions.add_parser("rotate", help="rewrite payloads sealed under older keys (or plain) in batches")
    rotate.add_argument("--batch-size", type=_batch_size, default=500, help="rows per transaction (default 500)")
    rotate.add_argument("--json", action="store_true", help="machine-readable output")
    add_database_options(rotate)
    add_logging_options(rotate)
    new_key = actions.add_parser("new-key", help="print a fresh ID:<base64 of 32 random bytes> entry")
    new_key.add_argument("key_id", metavar="ID")
    add_logging_options(new_key)


async def _rotate_column(database: Database, column: encryption_sql.SealedColumn, key_id: str, size: int) -> int:
    rewritten_total = 0
    after = "(0,0)"
    while True:
        async with database.transaction() as conn:
            batch = await encryption_sql.sealed_batch(conn, column, key_id=key_id, after=after, limit=size)
            rewritten = [
                encryption_sql.StoredPayload(row.at, codecs.reseal(row.value, whole=column.whole))
                for row in batch
                # a value in the object store keeps the key it was sealed with: sealed again
                # here it would be written as an object no instance owns (kenning.objects.payloads)
                if not codecs.is_current(row.value, whole=column.whole) and not has_references(row.value)
            ]
            await encryption_sql.sealed_rewrite(conn, column, rewritten)
        rewritten_total += len(rewritten)
        if len(batch) < size:
            return rewritten_total
        after = batch[-1].at


async def rotate(database: Database, *, batch_size: int) -> dict[str, int]:
    """Rows rewritten per ``table.column``."""
    key_id = codecs.encrypting_key_id()
    if not key_id:
        raise UsageError("KENNING_ENCRYPTION_KEYS is not set: rotate seals payloads under its first key; set it")
    counts: dict[str, int] = {}
    for column in encryption_sql.SEALED_COLUMNS:
        counts[f"{column.table}.{column.column}"] = await _rotate_column(database, column, key_id, batch_size)
    return counts


async def _run(args: argparse.Namespace) -> dict[str, int]:
    database = connect(args.database_url, pool_size=1, max_overflow=0)
    try:
        return await rotate(database, batch_size=args.batch_size)
    finally:
        await database.dispose()


def run(args: argparse.Namespace) -> int:
    if args.action == "new-key":
        try:
            codecs.parse_keys(codecs.new_key_text(args.key_id))
        except Exception as error:
            raise UsageError(str(error).replace(codecs.KEYS_VARIABLE + ": ", "")) from None
        emit(codecs.new_key_text(args.key_id))
        return 0
    counts = asyncio.run(_run(args))
    if args.json:
        emit_json({"key": codecs.encrypting_key_id(), "rewritten": counts})
        return 0
    emit(table(["column", "rewritten"], list(counts.items())))
    return 0
