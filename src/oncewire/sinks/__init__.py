"""sinks: adapters that perform effects."""

from oncewire.sinks.subprocess import SubprocessSink

__all__ = ["SubprocessSink"]
