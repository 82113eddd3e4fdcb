"""The values ``kenning mcp``'s tools show: opened, bounded, never pulled whole.

A tool reads each value bounded (``kenning.storage.console.Bounds``: whole up to 4 KiB of
JSON, else a preview of its text). Here every value is opened as the console opens it:

- sealed (``kenning.codecs``): opened with this process's key, ``"encrypted"`` without
  one; a wrong key raises ``EncryptionKeyError``, which the tool answers as a one-line
  error. A sealed value too large to be read whole by the query is read whole here, up to
  ``OPEN_LIMIT`` bytes (it cannot be opened in part), then previewed; a larger one is a note.
- offloaded (a reference to the object store, ``kenning.objects.offload``): the first
  ``preview`` bytes of the object (a ranged read), or, for a sealed object, the object
  read and opened up to ``OPEN_LIMIT`` bytes; never more. A store that fails is a note in
  the value's place, not the tool's failure.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from kenning import codecs
from kenning.codecs.errors import PayloadEncryptedError
from kenning.errors import ObjectStoreError
from kenning.objects import payloads
from kenning.objects.offload import Reference, fetched, store_of
from kenning.objects.store import split_url
from kenning.storage.console import Bounds

OPEN_LIMIT = 1 << 20  # bytes of a sealed value read whole to open it (it opens only whole)
_SEALED_HEAD = '{"' + codecs.ENVELOPE_KEY + '"'
_DEPTH = 4  # how deep in a value references and envelopes are looked for (a step's {"result": ...})

WholeReader = Callable[[], Awaitable[Any]]  # a value's stored JSON read whole (None: gone)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _has_key() -> bool:
    return bool(codecs.chain())


def _opened(envelope: Any) -> Any:
    """A sealed value opened, references inside left as they are (``payloads.deferred``);
    ``ENCRYPTED`` without a key; raises ``EncryptionKeyError`` for a wrong one."""
    try:
        with payloads.deferred():
            return codecs.unseal(envelope)
    except PayloadEncryptedError:
        return codecs.ENCRYPTED


async def _object(reference: Reference, bounds: Bounds) -> dict[str, Any]:
    """What a tool shows of an object: its address and size, and its start or itself."""
    shown: dict[str, Any] = {"$ref": reference.url, "size": reference.size}
    bucket, key = split_url(reference.url)
    try:
        head = b""
        async for chunk in store_of(bucket).stream(key, limit=bounds.preview):
            head += chunk
        if not head.decode(errors="ignore").startswith(_SEALED_HEAD):
            return {**shown, "preview": head.decode(errors="ignore")[: bounds.preview]}
        if not _has_key():
            return {**shown, "preview": codecs.ENCRYPTED}
        if reference.size > OPEN_LIMIT:
            note = f"({codecs.ENCRYPTED}: {reference.size} bytes, more than the {OPEN_LIMIT} opened here)"
            return {**shown, "preview": note}
        value = await opened(await fetched(reference), bounds)
    except ObjectStoreError as error:
        return {**shown, "preview": f"(the value is in the object store and cannot be read: {error})"}
    text = _text(value)
    if len(text.encode()) <= bounds.bound:
        return {**shown, "value": value}
    return {**shown, "preview": text[: bounds.preview]}


async def opened(value: Any, bounds: Bounds, depth: int = _DEPTH) -> Any:
    """``value`` (stored JSON) with its envelopes opened and its references previewed."""
    if codecs.is_sealed(value):
        inner = _opened(value)
        return inner if inner == codecs.ENCRYPTED else await opened(inner, bounds, depth)
    reference = Reference.of(value)
    if reference is not None:
        return await _object(reference, bounds)
    if depth == 0:
        return value
    if isinstance(value, dict):
        return {key: await opened(item, bounds, depth - 1) for key, item in value.items()}
    if isinstance(value, list):
        return [await opened(item, bounds, depth - 1) for item in value]
    return value


# How an envelope's text may begin in a preview: jsonb orders an object's keys shorter
# first, so the row's text has the ciphertext ("v") before the key id ("$enc").
_ENVELOPE_STARTS = (_SEALED_HEAD, '{"v": "')


def envelope_at(preview: str) -> int:
    """Where in a preview's text an envelope may begin (-1: none does)."""
    found = [at for at in (preview.find(head) for head in _ENVELOPE_STARTS) if at >= 0]
    return min(found, default=-1)


async def bounded_column(
    row: dict[str, Any], name: str, bounds: Bounds, whole: WholeReader | None, size_name: str | None = None
) -> None:
    """Open ``row``'s bounded value ``name`` in place (its ``<name>`` and ``<name>_preview``)."""
    preview_name = f"{name}_preview" if f"{name}_preview" in row else "preview"
    preview = row.get(preview_name)
    if preview is None:
        if row.get(name) is not None:
            row[name] = await _fitted(await opened(row[name], bounds), row, name, preview_name, bounds)
        return
    if not isinstance(preview, str) or envelope_at(preview) < 0:
        return  # plain text's start: as it is
    size = int(row.get(size_name or f"{name}_size") or 0)
    if whole is not None and size <= OPEN_LIMIT:  # read whole, opened: the plain parts kept
        row[preview_name] = _text(await opened(await whole(), bounds))[: bounds.preview]
    elif _has_key():
        row[preview_name] = f"({codecs.ENCRYPTED}: {size} bytes, more than the {OPEN_LIMIT} opened here)"
    else:
        row[preview_name] = preview[: envelope_at(preview)] + codecs.ENCRYPTED


async def _fitted(value: Any, row: dict[str, Any], name: str, preview_name: str, bounds: Bounds) -> Any:
    """An opened value larger than the bound, as a preview beside it (None in its place)."""
    text = _text(value)
    if len(text.encode()) <= bounds.bound:
        return value
    row[preview_name] = text[: bounds.preview]
    return None
