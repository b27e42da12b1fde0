"""Encoding: documents and conversations to token ids (loading a tokenizer, the encoders, loss-mask flags)."""
