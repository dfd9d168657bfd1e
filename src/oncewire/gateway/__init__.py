"""The gateway: a chat service on top of oncewire's ledgers (design: docs/gateway.md).

What exists so far: the model client (:mod:`oncewire.gateway.model`, over
:mod:`oncewire.gateway.http`) and the configuration file (:mod:`oncewire.gateway.config`).
This package imports nothing on its own, so ``oncewire.gateway.config`` works without the
``gateway`` extra; the HTTP modules need it (``pip install 'oncewire[gateway]'``).
"""
