"""Payload codecs (issue 36): the boundary every user payload crosses to and from the
database, the chain of codecs applied there, and AES-256-GCM encryption with rotating keys.

``seal``/``unseal`` are the boundary; ``register`` adds a user's codec (compression, a KMS,
an object store) to this process's chain; ``KENNING_ENCRYPTION_KEYS`` gives the keys.
"""

from __future__ import annotations

from kenning.codecs.aesgcm import KEYS_VARIABLE, AesGcmCodec, new_key_text, parse_keys
from kenning.codecs.boundary import (
    ENCRYPTED,
    ENVELOPE_KEY,
    chain,
    configure,
    encrypting_key_id,
    is_current,
    is_sealed,
    register,
    reseal,
    reset,
    seal,
    seal_bytes,
    sealed_key_id,
    shown,
    unseal,
    unseal_bytes,
)
from kenning.codecs.chain import CodecChain, PayloadCodec
from kenning.codecs.errors import CodecError, EncryptionKeyError, PayloadEncryptedError

__all__ = [
    "ENCRYPTED",
    "ENVELOPE_KEY",
    "KEYS_VARIABLE",
    "AesGcmCodec",
    "CodecChain",
    "CodecError",
    "EncryptionKeyError",
    "PayloadCodec",
    "PayloadEncryptedError",
    "chain",
    "configure",
    "encrypting_key_id",
    "is_current",
    "is_sealed",
    "new_key_text",
    "parse_keys",
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
