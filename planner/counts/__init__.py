"""Tokens per document: estimates, the count pass (processes or Ray), per-shard counts."""
