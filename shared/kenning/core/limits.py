"""Limits every way into Kenning enforces alike (``Client.start`` and the ingress)."""

from __future__ import annotations

MAX_ID_LENGTH = 1024
"""Longest instance id, idempotency key, or CloudEvent ``id``/``source``, in characters:
``Client.start`` refuses a longer one, and it is the default of the ingress's
``--ingress-max-id-length`` (ids in its paths and events)."""
