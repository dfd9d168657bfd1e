"""The gateway: a chat service on top of oncewire's ledgers (guide: docs/gateway.md).

``oncewire gateway run`` (:mod:`oncewire.gateway.runner`) runs it: boot recovery from the rows,
Telegram polling with admission before confirmation, one turn per session (:mod:`.turn`: model
steps, tools as outbox effects (:mod:`.tools`), previews that never block the commit), and the
reply engine's delivery. Around it: the configuration file
(:mod:`oncewire.gateway.config`) and its start-up check (:mod:`oncewire.gateway.check`, the
``oncewire gateway check`` command), the model client (:mod:`oncewire.gateway.model`, over
:mod:`oncewire.gateway.http`), the platform adapters (:mod:`oncewire.gateway.platforms`:
Telegram's Bot API with its update poller, and the generic webhook platform) and the per-bot
rate limiter they consult (:mod:`oncewire.gateway.ratelimit`).

This package imports nothing on its own, so ``oncewire.gateway.config``, ``.ratelimit`` and
``.check`` work without the ``gateway`` extra; the HTTP modules need it
(``pip install 'oncewire[gateway]'``).
"""
