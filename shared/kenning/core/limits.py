"""Limits every way into Kenning enforces alike (``Client.start`` and the ingress)."""

from __future__ import annotations

MAX_ID_LENGTH = 1024
"""Longest instance id, idempotency key, or CloudEvent ``id``/``source``, in characters:
``Client.start`` refuses a longer one, and it is the default of the ingress's
``--ingress-max-id-length`` (ids in its paths and events)."""

MAX_VALUE_KEY_LENGTH = 256
"""Longest key of a published value or search attribute (``publish_value``), in characters."""

MAX_VALUE_CHARS = 256 * 1024
"""Largest published value (``publish_value``, ``set_status``), in characters of its JSON:
values are read whole by clients and the console, so they stay small; a larger one is
refused before any write (``UnstorableValueError``), unless an object store takes it
(``KENNING_OBJECT_STORE``: the row keeps a reference, ``kenning.objects.payloads``)."""

MAX_REPLY_BYTES = 1024 * 1024
"""Largest reply to a request (``message.reply``'s value, or ``reply_error``'s reason), in
bytes of its JSON: the client reads it in one row, and a request is a conversation, not a
data transfer; a larger one raises ``ValueError`` in the workflow before any write, unless
an object store takes it (``KENNING_OBJECT_STORE``)."""

MAX_SEARCH_VALUE_LENGTH = 1024
"""Longest search attribute value (as text), in characters: it is a key of a btree index,
whose entries PostgreSQL caps at about 2.7 kB."""

MAX_STREAM_ENTRY_CHARS = 256 * 1024
"""Largest stream entry (``write_stream``), in characters of its JSON: an entry is a
message of a conversation (a token, a part, a tool's result), read whole by every reader;
a larger one raises ``UnstorableValueError`` before any write, unless an object store
takes it (``KENNING_OBJECT_STORE``)."""

MAX_STREAM_ENTRIES = 100_000
"""Most entries one stream holds (``write_stream``): the next write raises
``StreamFullError``; write on under a new key."""
