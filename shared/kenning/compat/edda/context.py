"""``edda.context``: Kenning's ``WorkflowContext``."""

from kenning.context import WorkflowContext

__all__ = ["WorkflowContext"]
