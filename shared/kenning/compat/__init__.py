"""Thin compatibility layers for programs written for other engines' APIs: ``edda`` (Edda
0.16's module layout and names, where Kenning has the same meaning; docs/migrating-from-edda.md)."""
