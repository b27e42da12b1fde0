"""Selections by metadata: where, sidecar joins, dedup, pruning, remote tables, copies, overlaps."""
