"""The codecs' errors: each message one line saying what to fix."""

from __future__ import annotations

from kenning.errors import KenningError


class CodecError(KenningError):
    """A stored payload could not be decoded (damaged, or a codec missing from the chain)."""


class EncryptionKeyError(CodecError):
    """A payload needs a key this process was not given, or the key given under its id is wrong."""


class PayloadEncryptedError(EncryptionKeyError):
    """A payload is encrypted and this process has no key at all: show it as "encrypted"."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"a payload is encrypted (key {key_id!r}) and KENNING_ENCRYPTION_KEYS is not set: set it to read payloads"
        )
