"""Packing: token ids into rows (lanes of estimated plans, sequences of exact plans) and run lengths."""
