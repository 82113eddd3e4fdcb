"""The shared vocabulary: records, names, limits and pure helpers that every layer uses
(the engine, storage, the client, the processes). Imports nothing of Kenning but
``kenning.errors`` and itself, so no import circle can pass through it (River's
``rivertype``). Internal: the public API is ``kenning``'s top-level modules."""
