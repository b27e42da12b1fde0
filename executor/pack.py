"""Wrap packing: concatenate tokenized documents and cut the stream into rows of ``max_length`` tokens.

Invariant: concatenating the valid tokens of every row, in order, reproduces the token stream exactly —
no token is lost, duplicated or reordered. A document that does not fit in the current row continues at
the start of the next one. At the end of the plan the last, shorter row is padded with ``pad_id`` and its
``length`` says how many tokens are real.

Worked example, ``max_length`` 4, documents [a1 a2 E] [b1 E] [c1 c2 c3 E] (E = EOS):
stream a1 a2 E b1 E c1 c2 c3 E → rows [a1 a2 E b1] [E c1 c2 c3] [E p p p] (length 1), with document
starts marked at row 0 col 0 and 3, row 1 col 1, and none in row 2 (its E continues document c).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class PackedRows:
    """Rows cut from the stream: ``tokens`` (n, max_length), ``doc_start`` marks, valid ``lengths``."""

    tokens: np.ndarray
    doc_start: np.ndarray
    lengths: np.ndarray


class WrapPacker:
    """Accumulates documents and hands out full rows; ``finish`` pads the remainder."""

    def __init__(self, max_length: int, pad_id: int) -> None:
        self.max_length = max_length
        self.pad_id = pad_id
        self._tokens = np.empty(0, dtype=np.int64)
        self._starts = np.empty(0, dtype=bool)

    def push(self, docs: list[np.ndarray]) -> PackedRows | None:
        """Add documents; return the rows that are now complete (or None)."""
        if not docs:
            return None
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        starts = np.zeros(int(lengths.sum()), dtype=bool)
        starts[np.cumsum(lengths) - lengths] = True
        tokens = np.concatenate([self._tokens, *docs])
        marks = np.concatenate([self._starts, starts])
        n_rows = len(tokens) // self.max_length
        cut = n_rows * self.max_length
        self._tokens, self._starts = tokens[cut:], marks[cut:]
        if n_rows == 0:
            return None
        return PackedRows(
            tokens=tokens[:cut].reshape(n_rows, self.max_length),
            doc_start=marks[:cut].reshape(n_rows, self.max_length),
            lengths=np.full(n_rows, self.max_length, dtype=np.int64),
        )

    def finish(self) -> PackedRows | None:
        """The last, padded row, if any tokens remain."""
        n = len(self._tokens)
        if n == 0:
            return None
        tokens = np.full((1, self.max_length), self.pad_id, dtype=np.int64)
        tokens[0, :n] = self._tokens
        marks = np.zeros((1, self.max_length), dtype=bool)
        marks[0, :n] = self._starts
        self._tokens, self._starts = self._tokens[:0], self._starts[:0]
        return PackedRows(tokens=tokens, doc_start=marks, lengths=np.array([n], dtype=np.int64))


def split_rows(rows: PackedRows) -> Iterator[PackedRows]:
    """One PackedRows per row (for batching across pushes)."""
    for i in range(len(rows.lengths)):
        yield PackedRows(
            tokens=rows.tokens[i : i + 1],
            doc_start=rows.doc_start[i : i + 1],
            lengths=rows.lengths[i : i + 1],
        )
