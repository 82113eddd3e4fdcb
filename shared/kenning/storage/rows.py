"""Column lists of the statements whose rows become records, derived from the records'
fields: a field added to a record is then read by every statement that builds it (a
list written out in each statement missed one: ``InstanceRow.run`` read as its default)."""

from __future__ import annotations

import dataclasses

from kenning.core.records import InstanceRow

_INSTANCE_ROW_FIELDS = tuple(field.name for field in dataclasses.fields(InstanceRow))


def instance_row_columns(alias: str = "") -> str:
    """``InstanceRow``'s fields as the columns of ``kenning_instances`` (of ``alias`` when
    the statement names the table so), for ``InstanceRow(**row._asdict())``."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + name for name in _INSTANCE_ROW_FIELDS)
