"""Chat platform adapters over their real wire protocols: Telegram's Bot API
(:mod:`~oncewire.gateway.platforms.telegram`, with its update poller) and the generic webhook
platform (:mod:`~oncewire.gateway.platforms.webhook`).

Each adapter is a :class:`~oncewire.replies.wire.Platform`: it makes one wire call per
operation, never retries on its own, and classifies every answer into a typed outcome itself,
so nothing above it reads a status code or an error description.
"""
