"""``edda.compensation``: Kenning's compensations."""

from kenning.compensation import compensation, on_failure, register_compensation

__all__ = ["compensation", "on_failure", "register_compensation"]
