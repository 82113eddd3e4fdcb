"""What a payload codec is, and a chain of them.

A codec turns the bytes of a stored payload into other bytes and back (encryption,
compression, an object store's reference); a chain applies its codecs' ``encode`` in order
and their ``decode`` in reverse, so ``[compress, encrypt]`` compresses the plaintext and
decrypts before it decompresses. Codecs are synchronous: they run where a value becomes
stored JSON, inside the engine's and the client's writes, which are not all async.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class PayloadCodec(Protocol):
    """Bytes in, bytes out, and back: ``decode(encode(b)) == b``.

    ``decode`` is given only bytes its own ``encode`` made (in a chain: after the codecs
    after it have decoded theirs). A codec that cannot decode raises an exception whose
    message says what to fix; ``kenning.codecs.CodecError`` is the one Kenning's own raise.
    """

    def encode(self, value: bytes) -> bytes: ...

    def decode(self, value: bytes) -> bytes: ...


class CodecChain:
    """Codecs applied in order on the way to the database, in reverse on the way back."""

    def __init__(self, codecs: Iterable[PayloadCodec] = ()) -> None:
        self.codecs: tuple[PayloadCodec, ...] = tuple(codecs)

    def __bool__(self) -> bool:
        return bool(self.codecs)

    def __len__(self) -> int:
        return len(self.codecs)

    def encode(self, value: bytes) -> bytes:
        for codec in self.codecs:
            value = codec.encode(value)
        return value

    def decode(self, value: bytes) -> bytes:
        for codec in reversed(self.codecs):
            value = codec.decode(value)
        return value

    def __repr__(self) -> str:
        return f"CodecChain({list(self.codecs)!r})"
