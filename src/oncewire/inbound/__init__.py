"""inbound: messages received from chat platforms, admitted once."""

from oncewire.inbound.service import Admission, Inbox
from oncewire.storage.replies import Inbound, InboundState

__all__ = ["Admission", "Inbound", "InboundState", "Inbox"]
