"""Large values out of their rows: the reference envelope, written and read back.

A value whose JSON is larger than the threshold is written to the object store under
``<prefix>/<instance>/<sha256>`` and its row keeps a reference in the same jsonb column::

    {"$ref": "s3://bucket/prefix/<instance>/<sha256>", "size": 104857600, "sha256": "..."}

The key is the content's digest, so a retried step writes the same object again (one
object, never a second copy). The object is written before the row's commit: a commit
that fails leaves an object no row names, which the scheduler's sweep deletes after a
grace period (``kenning.objects.sweep``). A reference is read back by whoever reads the
row (a worker replaying, ``Client.result``, the console), from the address it names, so a
reader needs the store's credentials, not the writer's ``KENNING_OBJECT_STORE``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kenning.errors import ObjectStoreError
from kenning.objects.store import Location, ObjectStore, split_url

REFERENCE_KEYS = frozenset({"$ref", "size", "sha256"})
DEFAULT_OFFLOAD_BYTES = 256 * 1024
# how deep in a row's JSON references are looked for: a step's {"result": ref}, a child's
# end as its parent's event {"data": {"result": ref}}
_SEARCH_DEPTH = 3


@dataclass(frozen=True)
class Reference:
    """What a row keeps of a value that lives in the object store."""

    url: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"$ref": self.url, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def of(value: Any) -> Reference | None:
        """The reference ``value`` is, or None (any other value, a user's dict included)."""
        if not isinstance(value, dict) or value.keys() != REFERENCE_KEYS:
            return None
        url, size, digest = value["$ref"], value["size"], value["sha256"]
        if not (isinstance(url, str) and url.startswith("s3://") and isinstance(size, int) and isinstance(digest, str)):
            return None
        return Reference(url, size, digest)


def encoded(value: Any) -> bytes:
    """The JSON bytes of a value: what the row would have held, and what the object holds."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class Offloader:
    """A process's store for values above ``threshold`` bytes of JSON (``location`` None:
    no store, every value stays in its row), checked at start; the writes themselves are
    the codec boundary's (``kenning.objects.payloads``)."""

    def __init__(self, location: Location | None, threshold: int = DEFAULT_OFFLOAD_BYTES) -> None:
        self.location = location
        self.threshold = threshold
        self.store = ObjectStore(location.bucket) if location is not None else None

    @classmethod
    def configured(cls, object_store: str, offload_bytes: int) -> Offloader:
        """From the settings (``--object-store``, ``--offload-bytes``)."""
        location = Location.parse(object_store) if object_store else None
        return cls(location, offload_bytes or DEFAULT_OFFLOAD_BYTES)

    async def check(self) -> None:
        if self.store is not None:
            await self.store.check()


_STORES: dict[str, ObjectStore] = {}


def store_of(bucket: str) -> ObjectStore:
    store = _STORES.get(bucket)
    if store is None:
        store = _STORES[bucket] = ObjectStore(bucket)
    return store


async def fetched(reference: Reference) -> Any:
    """The value a reference names, checked against its digest."""
    bucket, key = split_url(reference.url)
    data = await store_of(bucket).get(key)
    if len(data) != reference.size or hashlib.sha256(data).hexdigest() != reference.sha256:
        raise ObjectStoreError(
            f"reading {reference.url}: the object does not match its digest (altered outside Kenning?): restore it "
            "from the bucket's versions or backups"
        )
    return json.loads(data)


def has_references(value: Any, depth: int = _SEARCH_DEPTH) -> bool:
    if Reference.of(value) is not None:
        return True
    if depth == 0:
        return False
    if isinstance(value, dict):
        return any(has_references(item, depth - 1) for item in value.values())
    if isinstance(value, list):
        return any(has_references(item, depth - 1) for item in value)
    return False


async def restored(value: Any, depth: int = _SEARCH_DEPTH) -> Any:
    """``value`` with every reference (within ``depth`` levels) replaced by the value it
    names; a value holding none is returned as is, not copied."""
    reference = Reference.of(value)
    if reference is not None:
        return await fetched(reference)
    if depth == 0 or not has_references(value, depth):
        return value
    if isinstance(value, dict):
        return {key: await restored(item, depth - 1) for key, item in value.items()}
    if isinstance(value, list):
        return [await restored(item, depth - 1) for item in value]
    return value
