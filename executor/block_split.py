"""A block of rows cut together (``zephon.executor.estimated.LaneBatches``), split into the microbatches that
hand them out, in one pass a block."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zephon.executor.pack.rows import PackedRows
from zephon.executor.settings import handed_counts


def split_block(
    rows: PackedRows,
    spans: list[tuple[tuple[int, int], tuple[int, int]] | None],
    dataset_of: Callable[[np.ndarray], np.ndarray],
    num_datasets: int,
) -> list[tuple[PackedRows, tuple[list[int], list[int]]] | None]:
    """A block's rows as the microbatches that hand them out: for each of ``spans`` (the rows ``[a, b)`` of a
    microbatch, ``LaneBatches._spans``; None: not this worker's), its rows (views), its pieces renumbered from its
    first row, and its documents and tokens per dataset (``RunStats.handed_out``; ``dataset_of``: each plan
    position's dataset) — in a fixed number of NumPy calls a block, where a microbatch at a time cost a copy of
    its pieces, a search and two counts each (~50 µs of the caller's ~300 a microbatch). The same values as
    slicing each microbatch's rows and pieces and counting it alone."""
    assert rows.pieces is not None
    taken = [(k, span[1]) for k, span in enumerate(spans) if span is not None]
    out: list[tuple[PackedRows, tuple[list[int], list[int]]] | None] = [None] * len(spans)
    if not taken:
        return out
    pieces = rows.pieces.copy()
    row = pieces["row"]
    firsts = np.array([a for _, (a, _) in taken], dtype=np.int64)
    lo = np.searchsorted(row, firsts).tolist()
    hi = np.searchsorted(row, [b for _, (_, b) in taken]).tolist()
    sizes = np.subtract(hi, lo)
    owner = np.repeat(np.arange(len(taken)), sizes)  # each handed-out piece's microbatch (of ``taken``)
    handed_out = int(sizes.sum())
    if handed_out == len(pieces):  # every piece is handed out, in order (no other worker's rows between)
        row -= firsts[owner]
        handed = pieces
    else:
        chosen = np.repeat(np.subtract(lo, np.cumsum(sizes) - sizes), sizes) + np.arange(handed_out)
        row[chosen] -= firsts[owner]
        handed = pieces[chosen]
    docs, toks = handed_counts(dataset_of(handed["position"]), handed, owner, len(taken), num_datasets)
    for j, (k, (a, b)) in enumerate(taken):
        tokens, starts, lengths = rows.tokens[a:b], rows.doc_start[a:b], rows.lengths[a:b]
        packed = PackedRows(tokens=tokens, doc_start=starts, lengths=lengths, pieces=pieces[lo[j] : hi[j]])
        out[k] = (packed, (docs[j], toks[j]))
    return out
