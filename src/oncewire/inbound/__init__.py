"""inbound: messages received from chat platforms, admitted once."""

from oncewire.inbound.service import Admission, InboundView, Inbox
from oncewire.storage.replies import Inbound, InboundState

__all__ = ["Admission", "Inbound", "InboundState", "InboundView", "Inbox"]
