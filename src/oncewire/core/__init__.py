"""core: canonical JSON, errors, clock, ids and crash points. Imports nothing above it."""
