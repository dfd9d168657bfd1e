"""inbound: messages received from chat platforms, admitted once."""

from oncewire.inbound.service import Admission, InboundView
from oncewire.storage.replies import Inbound, InboundStatus

__all__ = ["Admission", "Inbound", "InboundStatus", "InboundView"]
