"""The object store's upkeep, run by the scheduler: expired instances' objects deleted
with them, and objects no row references swept after a grace period.

Objects are written before their row's commit (``kenning.objects.offload``), so a commit
that fails (a lost lease, the database away, a worker killed between the two) leaves an
object no row names. The sweep lists the store under ``KENNING_OBJECT_STORE``, and deletes
an object older than the grace period that neither its instance's rows nor its parent's
reference; the grace period covers a write whose commit is still on its way. A channel's
broadcast (under ``SHARED``) is kept while any mailbox or history references it. The same
sweep deletes what retention's own deletion missed (the store away at the time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

from kenning.db import Database
from kenning.objects import Location, ObjectStore
from kenning.objects.payloads import SHARED
from kenning.storage import objects as objects_sql

_REFERENCE_BATCH = 500  # instances whose references one statement reads


async def delete_instances_objects(location: Location, instance_ids: Sequence[str]) -> int:
    """Delete every object of these instances (retention: their rows are gone); the count."""
    store = ObjectStore(location.bucket)
    deleted = 0
    for instance_id in instance_ids:
        keys = [o.key for o in await store.listed(location.instance_prefix(instance_id))]
        await store.delete(keys)
        deleted += len(keys)
    return deleted


async def sweep_orphans(database: Database, location: Location, *, grace_seconds: float) -> int:
    """Delete the objects under ``location`` older than ``grace_seconds`` that no row
    references; the count."""
    store = ObjectStore(location.bucket)
    cutoff = datetime.now(UTC) - timedelta(seconds=grace_seconds)
    base = location.key() + "/" if location.prefix else ""
    by_instance: dict[str, list[str]] = defaultdict(list)
    for stored in await store.listed(base):
        quoted, slash, _ = stored.key[len(base) :].partition("/")
        if slash and stored.modified < cutoff:  # SHARED stays itself: "%" is quoted in an id
            by_instance[quoted if quoted == SHARED else unquote(quoted)].append(stored.key)
    deleted = 0
    shared = by_instance.pop(SHARED, [])
    if shared:  # a channel's broadcasts: referenced from any instance's rows
        marker = location.url(location.key(SHARED)) + "/"
        async with database.connection() as conn:
            referenced = await objects_sql.shared_references(conn, [location.url(key) for key in shared], marker)
        orphans = [key for key in shared if location.url(key) not in referenced]
        await store.delete(orphans)
        deleted += len(orphans)
    instance_ids = sorted(by_instance)
    for start in range(0, len(instance_ids), _REFERENCE_BATCH):
        batch = instance_ids[start : start + _REFERENCE_BATCH]
        async with database.connection() as conn:
            referenced = await objects_sql.object_references(conn, batch)
        orphans = [key for i in batch for key in by_instance[i] if location.url(key) not in referenced]
        await store.delete(orphans)
        deleted += len(orphans)
    return deleted
