"""Large values in an S3-compatible object store (issue 36): the store's calls (``store``),
the reference a row keeps instead of the value and how it is read back (``offload``).

Internal to Kenning. On the database's floor: imports only ``kenning.core``,
``kenning.errors`` and ``kenning.observability``; the worker, the client, the console
and the scheduler use it.
"""

from kenning.objects.offload import DEFAULT_OFFLOAD_BYTES, Offloader, Reference, restored
from kenning.objects.store import Location, ObjectStore

__all__ = ["DEFAULT_OFFLOAD_BYTES", "Location", "ObjectStore", "Offloader", "Reference", "restored"]
