"""The relayer process: publishes outbox events to the broker (``kenning relayer``).

``Relayer`` is imported on first use, so ``kenning`` commands that do not relay do not
load httpx and the cloudevents SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kenning_relayer.settings import RelayerSettings

if TYPE_CHECKING:
    from kenning_relayer.relayer import Relayer

__all__ = ["Relayer", "RelayerSettings"]


def __getattr__(name: str) -> Any:
    if name == "Relayer":
        from kenning_relayer.relayer import Relayer

        return Relayer
    raise AttributeError(f"module 'kenning_relayer' has no attribute {name!r}")
