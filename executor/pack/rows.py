"""Packed rows: the value that crosses from packing to batching.

Wrap packing (estimated plans: ``zephon.executor.pack.lanes``; exact plans: ``zephon.executor.exact``)
concatenates tokenized documents and cuts the stream into rows of ``max_length`` tokens.

Invariant: concatenating the valid tokens of every row of a stream, in order, reproduces that stream
exactly — no token is lost, duplicated or reordered. A document that does not fit in the current row
continues at the start of the next one. At the end of the plan the last, shorter row is padded with
``pad_id`` and its ``length`` says how many tokens are real.

Worked example, ``max_length`` 4, documents [a1 a2 E] [b1 E] [c1 c2 c3 E] (E = EOS):
stream a1 a2 E b1 E c1 c2 c3 E → rows [a1 a2 E b1] [E c1 c2 c3] [E p p p] (length 1), with document
starts marked at row 0 col 0 and 3, row 1 col 1, and none in row 2 (its E continues document c).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class PackedRows:
    """Rows cut from the stream: ``tokens`` (n, max_length), ``doc_start`` marks, valid ``lengths``, and
    ``pieces`` (``PIECE_DTYPE``): which tokens of which plan document fill each row — its provenance."""

    tokens: np.ndarray
    doc_start: np.ndarray
    lengths: np.ndarray
    pieces: np.ndarray | None = None


#: One piece of a row: ``length`` tokens of the document at plan ``position``, from its token ``doc_start``,
#: at column ``offset`` of row ``row``.
PIECE_DTYPE = np.dtype(
    [("row", np.int32), ("offset", np.int32), ("position", np.int64), ("doc_start", np.int32), ("length", np.int32)]
)


def make_pieces(records: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """``(row, offset, position, doc_start, length)`` tuples as a ``PIECE_DTYPE`` array."""
    return np.array(records, dtype=PIECE_DTYPE)
