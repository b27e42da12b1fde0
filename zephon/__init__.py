"""Zephon: deterministic plans for training data, executed as token batches."""
