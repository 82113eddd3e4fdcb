"""``edda.activity``: Kenning's ``activity``."""

from kenning.activity import activity

__all__ = ["activity"]
