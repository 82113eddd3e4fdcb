"""Large values at the codec boundary: every user payload, whatever its kind.

``kenning.codecs.seal`` hands each stored value (already encrypted, when keys are set) to
``offloaded``; one whose JSON is larger than ``KENNING_OFFLOAD_BYTES`` is written to
``KENNING_OBJECT_STORE`` and its row keeps the reference (``kenning.objects.offload``).
``kenning.codecs.unseal`` hands a reference to ``fetched``, which reads the value back. So
inputs, step and workflow results, messages, requests and replies, published values and
stream entries all leave their rows the same way, in every process that writes them (the
worker, the client, the CLI), and every reader gets the value back.

Where an object lives: ``<prefix>/<owner>/<sha256>``, the owner being the instance whose
rows keep the reference (``owned_by``: the worker sets the instance it runs, the client
and the storage functions the instance they write to), so retention deletes an
instance's objects with it. A channel's broadcast is copied into many instances' rows:
its object lives under ``SHARED`` and the scheduler's sweep deletes it once no row
references it.

The calls are synchronous (the boundary is: it runs inside writes that are not all
async): a large value blocks its caller's thread for its upload, as its encoding and
encryption already did. The worker reads history, inputs and results ahead of the
replay without blocking (``kenning.objects.offload.restored``); ``deferred`` leaves
references in place for it.

A store that fails raises ``ObjectStoreError`` (one line naming what to fix); inside a
worker's run (``in_run``) it raises ``ObjectStoreUnavailable`` instead, which ends the
run without compensating anything: the instance waits for the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from kenning.errors import ConfigurationError, ObjectStoreError, ObjectStoreUnavailable
from kenning.objects.offload import DEFAULT_OFFLOAD_BYTES, Reference, encoded, store_of
from kenning.objects.store import Location, split_url

STORE_VARIABLE = "KENNING_OBJECT_STORE"
BYTES_VARIABLE = "KENNING_OFFLOAD_BYTES"
# the owner of a value many instances' rows reference (a channel's broadcast): "%" is
# quoted in an instance's segment ("%25"), so no instance's objects can live here
SHARED = "%shared"

_lock = threading.Lock()
_configured: tuple[Location | None, int] | None = None  # None: read the environment
_owner: ContextVar[str] = ContextVar("kenning_payload_owner", default="")  # "": SHARED
_deferred: ContextVar[bool] = ContextVar("kenning_payload_deferred", default=False)
_in_run: ContextVar[bool] = ContextVar("kenning_payload_in_run", default=False)


def configure(object_store: str | None = None, offload_bytes: int | None = None) -> None:
    """This process's store and threshold (``None``: from ``KENNING_OBJECT_STORE`` and
    ``KENNING_OFFLOAD_BYTES``); validates now, so a bad value fails at start."""
    global _configured
    location = _parse(os.environ.get(STORE_VARIABLE, "") if object_store is None else object_store)
    threshold = offload_bytes if offload_bytes is not None else _threshold_from_environment()
    with _lock:
        _configured = (location, threshold)


def reset() -> None:
    """Back to the state of a fresh process (tests)."""
    global _configured
    with _lock:
        _configured = None


def _parse(url: str) -> Location | None:
    return Location.parse(url) if url else None


def _threshold_from_environment() -> int:
    text = os.environ.get(BYTES_VARIABLE, "")
    if not text:
        return DEFAULT_OFFLOAD_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"{BYTES_VARIABLE} must be a positive number of bytes, got {text!r}") from None
    if value <= 0:
        raise ConfigurationError(f"{BYTES_VARIABLE} must be a positive number of bytes, got {text!r}")
    return value


def settings() -> tuple[Location | None, int]:
    """(the store values are written to or None, the threshold in bytes of JSON)."""
    global _configured
    configured = _configured
    if configured is not None:  # every seal asks: no lock once it is known
        return configured
    with _lock:
        if _configured is None:
            _configured = (_parse(os.environ.get(STORE_VARIABLE, "")), _threshold_from_environment())
        return _configured


def enabled() -> bool:
    """Whether large values leave their rows in this process."""
    return settings()[0] is not None


@contextmanager
def owned_by(instance_id: str | None) -> Iterator[None]:
    """Values sealed inside belong to ``instance_id``'s rows (``None``: to many, ``SHARED``)."""
    token = _owner.set(instance_id or "")
    try:
        yield
    finally:
        _owner.reset(token)


@contextmanager
def deferred() -> Iterator[None]:
    """``fetched`` leaves references as they are inside: the caller reads them later,
    asynchronously (the worker's claim, whose rows it restores before the replay)."""
    token = _deferred.set(True)
    try:
        yield
    finally:
        _deferred.reset(token)


@contextmanager
def in_run() -> Iterator[None]:
    """Inside a worker's run: a store that fails raises ``ObjectStoreUnavailable``."""
    token = _in_run.set(True)
    try:
        yield
    finally:
        _in_run.reset(token)


def enter_run(instance_id: str) -> None:
    """In the current context (a worker's task for one instance, which its activities'
    tasks inherit): ``owned_by(instance_id)`` and ``in_run``, references fetched."""
    _owner.set(instance_id)
    _in_run.set(True)
    _deferred.set(False)


def _failed(error: ObjectStoreError) -> BaseException:
    return ObjectStoreUnavailable(str(error)) if _in_run.get() else error


def offloaded(stored_json: Any) -> Any:
    """``stored_json`` as its row keeps it: itself, or the reference to the object written."""
    location, threshold = settings()
    if location is None or Reference.of(stored_json) is not None:
        return stored_json
    data = encoded(stored_json)
    if len(data) <= threshold:
        return stored_json
    digest = hashlib.sha256(data).hexdigest()
    owner = _owner.get()
    key = (location.instance_prefix(owner) if owner else location.key(SHARED) + "/") + digest
    try:
        store_of(location.bucket).put_now(key, data)
    except ObjectStoreError as error:
        raise _failed(error) from error
    return Reference(location.url(key), len(data), digest).to_json()


def fetched(reference: Reference) -> Any:
    """The stored JSON a reference names, checked against its digest (``deferred``: the
    reference itself)."""
    if _deferred.get():
        return reference.to_json()
    try:
        bucket, key = split_url(reference.url)
        data = store_of(bucket).get_now(key)
        if len(data) != reference.size or hashlib.sha256(data).hexdigest() != reference.sha256:
            raise ObjectStoreError(
                f"reading {reference.url}: the object does not match its digest (altered outside Kenning?): "
                "restore it from the bucket's versions or backups"
            )
    except ObjectStoreError as error:
        raise _failed(error) from error
    return json.loads(data)


def too_large(what: str, size: int, limit: int, unit: str = "characters") -> str:
    """The one line for a value over a row's limit, naming the setting that lifts it."""
    line = f"{what} cannot be stored: {size} {unit} of JSON, more than {limit}"
    if enabled():  # a store is set: the value is below the threshold yet above the limit
        return f"{line}: lower {BYTES_VARIABLE} below {limit} to keep it in the object store"
    return f"{line} a row holds: set {STORE_VARIABLE} (s3://bucket/prefix) to keep larger values in an object store"
