"""An exact plan's rows cut from the run's document cache for many microbatches at once, then split.

``ExactSequences`` (``zephon.executor.exact``) finds the pieces of a chunk of microbatches' sequences in one
call and holds their documents in one array in plan order (its cache, ``zephon.executor.pack.spans``).
``cut_rows`` fills one ``(n, W)`` buffer for all ``n`` rows of the chunk — one slice per run of rows that
follow each other in the cache (one rank of dp 1: the whole chunk is one copy), else one slice a row, else one
gather — with their document starts and lengths, in a fixed number of numpy calls whatever the chunk's size.
``split_rows`` hands each microbatch its rows as views of those buffers and its pieces renumbered from row 0,
so per microbatch only a few slices are taken.

Invariant: each microbatch's ``PackedRows`` equal, array for array, those of cutting that microbatch alone
(tests/executor/test_exact_chunks.py).

Example, W = 4, cache ids [a a a E b E c c E] (documents at base 0, 4, 6), a chunk of two microbatches of one
row each, sequences 0 and 1 of a wrap plan: pieces (row 0: document 0 from 0, 4 ids at 0), (row 1: document 1
from 0, 2 ids at 0; document 2 from 0, 2 ids at 2). Row 0 starts at cache id 0, row 1 at 4 = 0 + W: the two
rows are cache ids 0..7, one copy. ``split_rows`` gives microbatch 0 row 0 with its one piece and microbatch 1
row 1 (a view) with its two pieces, their ``row`` set to 0.
"""

from __future__ import annotations

import numpy as np

from zephon.executor.encode.flags import filled
from zephon.executor.pack.rows import PackedRows
from zephon.executor.pack.spans import fill_rows, spread

__all__ = ["cut_rows", "split_rows"]


def cut_rows(
    pieces: np.ndarray, src: np.ndarray, source: np.ndarray, *, rows: int, width: int, pad_id: int, starts_all: bool
) -> PackedRows:
    """``rows`` rows of ``width`` from ``pieces`` (``PIECE_DTYPE``, sorted by row), piece ``i`` being the ids of
    ``source`` from ``src[i]``; ``starts_all``: every piece starts a document (best fit) instead of those from a
    document's token 0. Tokens not covered by a piece are ``pad_id``."""
    row, offset = pieces["row"].astype(np.int64), pieces["offset"].astype(np.int64)
    length = pieces["length"].astype(np.int64)
    full = int(length.sum()) == rows * width  # pieces never overlap: every token is covered, no padding to write
    tokens = np.empty((rows, width), source.dtype) if full else filled((rows, width), pad_id, source.dtype)
    if not fill_rows(tokens, source, row, offset, src, length):  # a run of rows or one row a slice, or:
        tokens.reshape(-1)[spread(row * width + offset, length)] = source[spread(src, length)]
    doc_start = np.zeros((rows, width), dtype=bool)
    doc_start.reshape(-1)[row * width + offset] = (pieces["doc_start"] == 0) | starts_all
    lengths = np.zeros(rows, dtype=np.int64)
    np.maximum.at(lengths, row, offset + length)
    return PackedRows(tokens=tokens, doc_start=doc_start, lengths=lengths, pieces=pieces)


def split_rows(packed: PackedRows, extra: np.ndarray, counts: list[int]) -> list[tuple[PackedRows, np.ndarray]]:
    """The rows of consecutive microbatches of ``counts[m]`` rows each, as views of ``packed``; their pieces
    (``row`` counted from the microbatch's first row) and ``extra`` (one value per piece) sliced alike."""
    assert packed.pieces is not None
    bounds = np.cumsum([0, *counts])
    if len(counts) == 1:
        return [(packed, extra)]
    pieces = packed.pieces.copy()
    first_piece = np.searchsorted(pieces["row"], bounds).tolist()
    owner = np.searchsorted(bounds, pieces["row"], side="right") - 1
    pieces["row"] -= bounds[owner].astype(pieces["row"].dtype)
    out = []
    for m, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        p, q = first_piece[m], first_piece[m + 1]
        rows = PackedRows(
            tokens=packed.tokens[lo:hi], doc_start=packed.doc_start[lo:hi], lengths=packed.lengths[lo:hi],
            pieces=pieces[p:q],
        )  # fmt: skip
        out.append((rows, extra[p:q]))
    return out
