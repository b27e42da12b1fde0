"""Dealing the documents of an estimated plan to packing lanes.

An estimated plan packs at train time, and packing is sequential: a row's content depends on every
document before it. To let ``D`` data-parallel ranks pack independently, documents are dealt to ``L`` lanes
at plan time; each lane is packed on its own, and a data-parallel size that divides ``L`` splits the lanes
among ranks without changing any row (docs/training.md).

Lanes should progress at the same speed in tokens, so that row ``k`` of every lane comes from the same
stretch of the plan. With token estimates, the plan's token stream is cut into chunks of ``QUANTUM``
tokens, dealt round-robin; a document goes to the lane of the chunk holding its middle token. Each lane
then holds ``T / L ± (QUANTUM + one document)`` of the first ``T`` tokens. Without estimates (sample
mixtures planned without a tokenizer), document ``p`` goes to lane ``p mod L``.

Example, L = 2, QUANTUM = 10, documents of 4, 4, 8, 3, 12 tokens: middles at 2, 6, 12, 17.5, 25 → chunks
0, 0, 1, 1, 2 → lanes 0, 0, 1, 1, 0.

``Dealer`` deals a plan that arrives in chunks, carrying the position and the cumulative token count from
chunk to chunk, in integers; the lanes equal ``deal`` over the whole plan (whose float64 sums are exact
below 2^53 tokens).
"""

from __future__ import annotations

import numpy as np

QUANTUM = 4096


def deal(length: int, lanes: int, tokens: np.ndarray | None) -> np.ndarray:
    """Lane (int16) of each of ``length`` documents in plan order."""
    if tokens is None:
        return (np.arange(length) % lanes).astype(np.int16)
    cumulative = np.cumsum(tokens, dtype=np.float64)
    middle = cumulative - tokens / 2.0
    return ((middle // QUANTUM).astype(np.int64) % lanes).astype(np.int16)


class Dealer:
    """``deal`` over a plan handed over in consecutive chunks."""

    def __init__(self, lanes: int, *, with_tokens: bool) -> None:
        self.lanes = lanes
        self.with_tokens = with_tokens
        self._position = 0
        self._tokens = 0

    def deal(self, chunk: np.ndarray | int) -> np.ndarray:
        """Lanes of the next chunk: its token counts, or (without tokens) its number of documents."""
        if not self.with_tokens:
            assert isinstance(chunk, int)
            cycle = np.roll(np.arange(self.lanes, dtype=np.int16), -(self._position % self.lanes))
            lanes = np.resize(cycle, chunk)
            self._position += chunk
            return lanes
        assert isinstance(chunk, np.ndarray)
        # Integer form of ``deal``: the middle token C - t/2 is a half-integer, and for a whole QUANTUM
        # floor((C - t/2) / QUANTUM) = floor((C - ceil(t/2)) / QUANTUM).
        cumulative = np.cumsum(chunk, dtype=np.int64)
        cumulative += self._tokens
        if len(cumulative):
            self._tokens = int(cumulative[-1])
        cumulative -= (chunk + 1) // 2
        cumulative //= QUANTUM
        cumulative %= self.lanes
        return cumulative.astype(np.int16)
