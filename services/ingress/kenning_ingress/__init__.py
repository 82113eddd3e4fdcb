"""The ingress process: CloudEvents over HTTP into the inbox (``kenning ingress``)."""

from kenning_ingress.app import create_app
from kenning_ingress.settings import IngressSettings

__all__ = ["IngressSettings", "create_app"]
