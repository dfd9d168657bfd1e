"""inbound: messages received from chat platforms, admitted once."""

from oncewire.inbound.service import Admission, InboundView, Inbox
from oncewire.storage.replies import Inbound, InboundStatus

__all__ = ["Admission", "Inbound", "InboundStatus", "InboundView", "Inbox"]
