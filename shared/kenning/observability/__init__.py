"""Logs, metrics, traces and fault points: what every layer reports through. Imports only
``kenning.core`` and ``kenning.errors``. Internal: the public API is ``kenning``'s
top-level modules."""
