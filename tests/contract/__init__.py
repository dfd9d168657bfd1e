"""The store contract suite (one suite, every backend)."""
