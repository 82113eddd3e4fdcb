"""AES-256-GCM with keys by id, as ``KENNING_ENCRYPTION_KEYS`` gives them.

``k2:<base64 of 32 bytes>,k1:<base64>``: the first key encrypts, every key decrypts, so a
key is rotated by putting the new one first and keeping the old ones until
``kenning encryption rotate`` has rewritten their rows. A sealed value carries the id of
its key (and the envelope repeats it, so a reader without keys, and the rotation's SQL,
know which key a row needs without decrypting it).
"""

from __future__ import annotations

import base64
import binascii
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kenning.codecs.errors import CodecError, EncryptionKeyError
from kenning.errors import ConfigurationError

KEYS_VARIABLE = "KENNING_ENCRYPTION_KEYS"
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_VERSION = 1
_NONCE_BYTES = 12


def parse_keys(text: str) -> dict[str, bytes]:
    """``id:base64,...`` -> {id: 32-byte key}, first key first; a malformed value raises
    ``ConfigurationError`` naming the entry (never the key's bytes)."""
    keys: dict[str, bytes] = {}
    for position, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        key_id = key_id.strip()
        if not sep or not _KEY_ID.match(key_id):
            raise ConfigurationError(
                f"{KEYS_VARIABLE}: entry {position} is not <key id>:<base64 of 32 bytes> "
                "(ids: letters, digits, '_', '.', '-')"
            )
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"{KEYS_VARIABLE}: key {key_id!r} is not valid base64") from None
        if len(key) != 32:
            raise ConfigurationError(
                f"{KEYS_VARIABLE}: key {key_id!r} is {len(key)} bytes, AES-256 needs 32 "
                "(make one with: python -c 'import os,base64; print(base64.b64encode(os.urandom(32)).decode())')"
            )
        if key_id in keys:
            raise ConfigurationError(f"{KEYS_VARIABLE}: key id {key_id!r} is given twice")
        keys[key_id] = key
    return keys


def new_key_text(key_id: str) -> str:
    """A fresh ``id:base64`` entry (``kenning encryption new-key``)."""
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode('ascii')}"


class AesGcmCodec:
    """``encode``: version byte, key id, 12-byte random nonce, ciphertext and tag."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        if not keys:
            raise ConfigurationError(f"{KEYS_VARIABLE}: no key given")
        self.key_id = next(iter(keys))
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def encode(self, value: bytes) -> bytes:
        key_id = self.key_id.encode("ascii")
        header = bytes([_VERSION, len(key_id)]) + key_id
        nonce = os.urandom(_NONCE_BYTES)
        # the header is authenticated: a key id swapped in the row fails the tag
        return header + nonce + self._ciphers[self.key_id].encrypt(nonce, value, header)

    def decode(self, value: bytes) -> bytes:
        key_id = key_id_of(value)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise EncryptionKeyError(
                f"a payload is encrypted with key {key_id!r}, which {KEYS_VARIABLE} does not hold: add that key"
            )
        header_end = 2 + value[1]
        nonce = value[header_end : header_end + _NONCE_BYTES]
        try:
            return cipher.decrypt(nonce, value[header_end + _NONCE_BYTES :], value[:header_end])
        except InvalidTag:
            raise EncryptionKeyError(
                f"a payload does not decrypt with key {key_id!r} of {KEYS_VARIABLE}: "
                "that id was given other key bytes than the ones that encrypted it"
            ) from None

    def __repr__(self) -> str:  # never the keys
        return f"AesGcmCodec(encrypting with {self.key_id!r}, keys {list(self._ciphers)!r})"


def key_id_of(value: bytes) -> str:
    """The id of the key an ``AesGcmCodec`` output was encrypted with."""
    if len(value) < 2 or value[0] != _VERSION or len(value) < 2 + value[1] + _NONCE_BYTES:
        raise CodecError("a payload is not AES-GCM output of Kenning's (damaged, or another codec's)")
    return value[2 : 2 + value[1]].decode("ascii", "replace")
