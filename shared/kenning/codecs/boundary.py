"""The one place every user payload passes on its way to and from the database.

``seal(value_json)`` is the stored JSON of a JSON-compatible value: the value itself when
no codec is configured, else an envelope ``{"$enc": "<key id>", "v": "<base64>"}`` (the
key id empty when only users' codecs ran) holding the chain's output for the value's JSON
text. ``unseal`` reverses it anywhere in a stored value (an envelope nested in a framework
record, a child's result inside its end event) and passes plain JSON through, so rows
written before encryption was turned on stay readable.

The process-wide chain is built on first use from ``KENNING_ENCRYPTION_KEYS`` and the
codecs given to ``register`` (users' own: compression, a KMS, an object store): those
registered plain run before encryption, those with ``after_encryption=True`` after it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from typing import Any

from kenning.codecs.aesgcm import KEYS_VARIABLE, AesGcmCodec, key_id_of, parse_keys
from kenning.codecs.chain import CodecChain, PayloadCodec
from kenning.codecs.errors import CodecError, PayloadEncryptedError
from kenning.objects import payloads
from kenning.objects.offload import Reference

ENVELOPE_KEY = "$enc"
ENCRYPTED = "encrypted"  # what the console, the CLI and kenning.testing show without the key

_lock = threading.Lock()
_before: list[PayloadCodec] = []
_after: list[PayloadCodec] = []
_keys_text: str | None = None  # None: read KENNING_ENCRYPTION_KEYS
_built: tuple[CodecChain, str] | None = None  # (chain, encrypting key id or "")


def register(codec: PayloadCodec, *, after_encryption: bool = False) -> None:
    """Add a codec of the user's to this process's chain (in every process that reads or
    writes payloads: the worker, the client, the CLI, the console)."""
    global _built
    if not isinstance(codec, PayloadCodec):
        raise TypeError(f"{codec!r} is not a PayloadCodec (it needs encode(bytes) -> bytes and decode(bytes) -> bytes)")
    with _lock:
        (_after if after_encryption else _before).append(codec)
        _built = None


def configure(*, keys: str | None = None, codecs: list[PayloadCodec] | None = None) -> None:
    """Set this process's keys (``None``: from ``KENNING_ENCRYPTION_KEYS``) and, when
    given, replace the users' codecs; validates now, so a bad value fails at start."""
    global _keys_text, _built
    with _lock:
        _keys_text = keys
        if codecs is not None:
            _before[:] = list(codecs)
            _after.clear()
        _built = None
    chain()


def reset() -> None:
    """Back to the state of a fresh process (tests)."""
    global _keys_text, _built
    with _lock:
        _keys_text = None
        _before.clear()
        _after.clear()
        _built = None


def keys_text() -> str:
    return os.environ.get(KEYS_VARIABLE, "") if _keys_text is None else _keys_text


def _build() -> tuple[CodecChain, str]:
    global _built
    with _lock:
        if _built is None:
            keys = parse_keys(keys_text())
            encryption = [AesGcmCodec(keys)] if keys else []
            _built = (CodecChain([*_before, *encryption, *_after]), encryption[0].key_id if encryption else "")
        return _built


def chain() -> CodecChain:
    """This process's chain (empty: payloads are stored as plain JSON)."""
    return _build()[0]


def encrypting_key_id() -> str:
    """The id of the key new payloads are encrypted with ("" when encryption is off)."""
    return _build()[1]


def is_sealed(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) == 2
        and isinstance(value.get(ENVELOPE_KEY), str)
        and isinstance(value.get("v"), str)
    )


def seal(value_json: Any) -> Any:
    """The stored form of a JSON-compatible value (see the module's docstring)."""
    codecs, key_id = _build()
    if not codecs or is_sealed(value_json):
        return payloads.offloaded(value_json)  # a large value leaves its row (kenning.objects.payloads)
    text = json.dumps(value_json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    encoded = codecs.encode(text.encode("utf-8"))
    return payloads.offloaded({ENVELOPE_KEY: key_id, "v": base64.b64encode(encoded).decode("ascii")})


def seal_bytes(raw: bytes) -> Any:
    """The stored form of binary data (an event's) when this process has codecs: an
    envelope of its base64 text, which the caller stores in the row's JSON column with an
    empty ``bytea`` beside it as the sign; None without codecs (stored as it came)."""
    if not chain():
        return None
    return seal(base64.b64encode(raw).decode("ascii"))


def unseal_bytes(stored_json: Any) -> bytes:
    """The bytes ``seal_bytes`` stored (its envelope, or the base64 text already opened)."""
    opened = unseal(stored_json)
    if not isinstance(opened, str):
        raise CodecError("a sealed binary payload is not base64 text (damaged row)")
    try:
        return base64.b64decode(opened, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError("a sealed binary payload is not valid base64 (damaged row)") from None


def unseal(stored_json: Any) -> Any:
    """The value ``seal`` stored, with every envelope inside it opened; plain JSON as is.

    Raises ``PayloadEncryptedError`` when this process has no key, ``EncryptionKeyError``
    when it lacks the payload's key, ``CodecError`` when the payload is damaged."""
    if isinstance(stored_json, dict):
        if is_sealed(stored_json):
            return _open(stored_json)
        reference = Reference.of(stored_json)
        if reference is not None:  # a large value, read back from the object store
            fetched = payloads.fetched(reference)
            return fetched if Reference.of(fetched) is not None else unseal(fetched)  # deferred: as is
        return {key: unseal(item) for key, item in stored_json.items()}
    if isinstance(stored_json, list):
        return [unseal(item) for item in stored_json]
    return stored_json


def shown(stored_json: Any) -> Any:
    """``unseal`` for display: ``"encrypted"`` in place of each payload this process has
    no key for, the plain parts around it (an error's type, an event's source) kept."""
    if isinstance(stored_json, dict):
        if is_sealed(stored_json):
            try:
                return unseal(_open(stored_json))
            except PayloadEncryptedError:
                return ENCRYPTED
        return {key: shown(item) for key, item in stored_json.items()}
    if isinstance(stored_json, list):
        return [shown(item) for item in stored_json]
    return stored_json


def _open(envelope: dict[str, Any]) -> Any:
    codecs, _ = _build()
    key_id = envelope[ENVELOPE_KEY]
    if not codecs:
        if key_id:
            raise PayloadEncryptedError(key_id)
        raise CodecError("a payload was stored through codecs this process was not given: register them")
    try:
        raw = base64.b64decode(envelope["v"], validate=True)
    except (binascii.Error, ValueError):
        raise CodecError("a stored payload envelope is not valid base64 (damaged row)") from None
    return unseal(json.loads(codecs.decode(raw)))  # a value sealed around envelopes (a list of sealed results)


def sealed_key_id(envelope: dict[str, Any]) -> str:
    """The key id a sealed value names ("" for users' codecs only)."""
    return str(envelope.get(ENVELOPE_KEY, ""))


__all__ = [
    "ENCRYPTED",
    "ENVELOPE_KEY",
    "KEYS_VARIABLE",
    "chain",
    "configure",
    "encrypting_key_id",
    "is_current",
    "is_sealed",
    "key_id_of",
    "keys_text",
    "register",
    "reseal",
    "reset",
    "seal",
    "seal_bytes",
    "sealed_key_id",
    "shown",
    "unseal",
    "unseal_bytes",
]


def is_current(stored_json: Any, *, whole: bool) -> bool:
    """Whether a stored value needs no rewrite by the rotation: every envelope in it is
    sealed under this process's encrypting key (and, for a ``whole`` column, the value is
    an envelope at all)."""
    key_id = encrypting_key_id()
    if whole:
        return is_sealed(stored_json) and stored_json[ENVELOPE_KEY] == key_id
    if isinstance(stored_json, dict):
        if is_sealed(stored_json):
            return bool(stored_json[ENVELOPE_KEY] == key_id)
        return all(is_current(item, whole=False) for item in stored_json.values())
    if isinstance(stored_json, list):
        return all(is_current(item, whole=False) for item in stored_json)
    return True


def reseal(stored_json: Any, *, whole: bool) -> Any:
    """A stored value with every envelope sealed again under the encrypting key; a
    ``whole`` column's plain value (written before encryption was on) is sealed."""
    key_id = encrypting_key_id()
    if whole:
        return seal(unseal(stored_json)) if not is_current(stored_json, whole=True) else stored_json
    if isinstance(stored_json, dict):
        if is_sealed(stored_json):
            return stored_json if stored_json[ENVELOPE_KEY] == key_id else seal(_open(stored_json))
        return {key: reseal(item, whole=False) for key, item in stored_json.items()}
    if isinstance(stored_json, list):
        return [reseal(item, whole=False) for item in stored_json]
    return stored_json
