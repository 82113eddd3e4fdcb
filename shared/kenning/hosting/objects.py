"""The object store's upkeep, run by the scheduler: expired instances' objects deleted
with them, and objects no row references swept after a grace period.

Objects are written before their row's commit (``kenning.objects.offload``), so a commit
that fails (a lost lease, the database away, a worker killed between the two) leaves an
object no row names. The sweep lists the store under ``KENNING_OBJECT_STORE``, and deletes
an object older than the grace period that neither its instance's rows nor its parent's
reference, nor any other row (searched for only when that object is otherwise an orphan);
the grace period covers a write whose commit is still on its way. A channel's
broadcast (under ``SHARED``) is kept while any mailbox or history references it. The same
sweep deletes what retention's own deletion missed (the store away at the time).

Retention keeps an expired instance's objects that other instances' rows still reference
(``kept_elsewhere``): a parent's history holds its child's result by the child's
reference, and a child expires on its own workflow's retention, which may be shorter
than its parent's, so deleting them would leave the parent's history unreadable (a fork,
a retry or the console reading it). Such an object is kept until no row references it,
then the sweep deletes it. The search is a whole scan of the histories, mailboxes, inbox
and outbox narrowed to rows that hold a reference into this store, run only for objects
otherwise about to be deleted.
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


def _marker(location: Location) -> str:
    """The start of every address under ``location``: what a row holding any reference
    into this store contains (narrows the whole-table search of ``kept_elsewhere``)."""
    return location.url(location.key() + "/" if location.prefix else "")


async def kept_elsewhere(database: Database, location: Location, keys: Sequence[str]) -> set[str]:
    """Which of these keys another instance's rows still reference: a parent's history
    keeps its child's result by the child's reference (``storage.children``), and a
    child can expire before its parent does, so its objects stay while the parent's rows
    name them (the sweep deletes them once nothing does)."""
    if not keys:
        return set()
    async with database.connection() as conn:
        referenced = await objects_sql.shared_references(conn, [location.url(k) for k in keys], _marker(location))
    return {key for key in keys if location.url(key) in referenced}


async def delete_instances_objects(database: Database, location: Location, instance_ids: Sequence[str]) -> int:
    """Delete the objects of these instances (retention: their rows are gone) that no
    other instance's rows reference; the count."""
    store = ObjectStore(location.bucket)
    deleted = 0
    for instance_id in instance_ids:
        keys = [o.key for o in await store.listed(location.instance_prefix(instance_id))]
        kept = await kept_elsewhere(database, location, keys)
        doomed = [key for key in keys if key not in kept]
        await store.delete(doomed)
        deleted += len(doomed)
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
        candidates = [key for i in batch for key in by_instance[i] if location.url(key) not in referenced]
        kept = await kept_elsewhere(database, location, candidates)  # a deleted child's, its parent's still
        orphans = [key for key in candidates if key not in kept]
        await store.delete(orphans)
        deleted += len(orphans)
    return deleted
