"""Fakes that speak real wire protocols on loopback, each run as its own process, for tests and
the lab. They journal every request (with fsync) before answering, and fail on command."""
