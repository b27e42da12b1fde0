"""The reference engine: Hugging Face ``tokenizers`` itself, always available, the one every other engine is
checked against. One ``encode_batch_fast`` call spreads over its own Rayon threads (``RAYON_NUM_THREADS``)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from zephon.executor.engines.base import Engine, TokenIds, from_lists


class TokenizersEngine(Engine):
    name = "tokenizers"
    package = "tokenizers"
    own_threads = True
    releases_gil = False  # its batch call already uses every core; count workers are processes

    def __init__(self, config_text: str, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(config_text)
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer.from_str(config_text)

    def encode(self, texts: Sequence[str]) -> TokenIds:
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return from_lists([e.ids for e in encodings])
