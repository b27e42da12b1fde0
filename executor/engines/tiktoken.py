"""The tiktoken engine: a tiktoken ``Encoding`` derived from the tokenizer.json (``tiktoken_derive``, which refuses
tokenizers it cannot run exactly), encoding a batch in one call on texts joined by a special
token when that is exact, else one call per text; ranks mapped back to the tokenizer's ids by a table when
they differ. Releases the GIL, so it is sliced over our threads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zephon.executor.engines.base import Engine, EngineUnavailable, TokenIds
from zephon.executor.engines.tiktoken_derive import (
    NotExact,
    encode_buffers,
    encode_joined,
    join_ranks,
    separator,
    tiktoken_engine,
)


class TiktokenEngine(Engine):
    name = "tiktoken"
    package = "tiktoken"

    def __init__(self, config_text: str, eos_text: str | None = None) -> None:
        super().__init__(config_text)
        self.eos_text = eos_text
        try:
            self.encoding, self.table = tiktoken_engine(config_text)
        except NotExact as exc:
            raise EngineUnavailable(f"not exact for this tokenizer: {exc}", lasting=True) from exc
        #: the special token texts are joined with (the EOS when it qualifies), and its rank
        self.sep = separator(self.encoding, eos_text)

    def __reduce__(self) -> tuple[object, tuple[str, str | None]]:
        return (type(self), (self.config_text, self.eos_text))

    def encode(self, texts: Sequence[str]) -> TokenIds:
        joined = encode_joined(self.encoding, texts, *self.sep) if self.sep is not None else None
        if joined is None:
            ranks, sizes = join_ranks(encode_buffers(self.encoding, texts), (), ())
        else:  # each text's ranks are followed by the separator's: drop it
            out, with_sep = joined
            ranks, sizes = np.delete(out, np.cumsum(with_sep) - 1), with_sep - 1
        return TokenIds(ranks if self.table is None else self.table[ranks], sizes)
