"""dispatch: the engines that move effects."""

from oncewire.dispatch.dispatcher import Dispatcher, DispatchStats, Sink
from oncewire.dispatch.retry import RetryPolicy

__all__ = ["DispatchStats", "Dispatcher", "RetryPolicy", "Sink"]
