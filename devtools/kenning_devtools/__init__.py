"""Kenning's developer tools: ``kenning up`` (the whole stack on one machine) and
``kenning bench`` (measurements beside limits from the same run). No process of a
deployment imports this package."""
