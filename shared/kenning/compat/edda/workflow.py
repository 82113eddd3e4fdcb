"""``edda.workflow``: Kenning's ``workflow``, and Edda's ``recur`` as ``continue_as_new``
(the next run of the same instance with the new input and a fresh history; Kenning keeps
the instance id, where Edda's recur started a new instance, and keeps its subscriptions)."""

from kenning.workflow import continue_as_new, workflow

recur = continue_as_new

__all__ = ["recur", "workflow"]
