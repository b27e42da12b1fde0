"""Homogeneous packing, planned offline: each dataset packed into its own rows, rows interleaved by weight.

Why: with ``wrap``, documents of every dataset share rows, and the token mixture is held by placing whole
documents (weighted fair queueing, ``zephon.planner.token_mix``). A single document of 100k tokens then moves
every window that holds it by its whole length — 1.6 pp in a window of 100 batches of 8 × 2049 tokens. Here a
row holds one dataset only, so the mixture is decided per *row*: any window of rows holds each dataset's share
to within one row at each end, whatever the document lengths.

Algorithm: dataset ``d``'s documents, in plan order, form its own token stream, cut into ``R_d = ⌈T_d / L⌉``
rows (wrap inside the dataset: a document continues into the dataset's next row). The global row order sorts
every row ``r`` of every dataset by ``(2r + 1) / (2 R_d)`` (ties by dataset), the midpoint rule: after any
``n`` rows, dataset ``d`` has ``n · R_d / Σ R`` rows within ±1. The plan writes the pieces like best fit's
(``bins.parquet``: sequence, offset, position, doc_start, length), so the executor builds rows the same way.

Invariant: every token of every document is in exactly one row; rows of a dataset are full except its last.

Trade-off: rows never mix datasets (a model sees a dataset's documents side by side within a row, and
documents still span rows of their own dataset), and each dataset's last row is padded (at most one row per
dataset in the plan). A document's tokens are no longer contiguous in the global stream: its rows are spread
by the interleaving. In exchange the window bound holds on any corpus: ``zephon audit`` reports it.

Worked example, L = 4, dataset a documents of 6 and 2 tokens (8 tokens: rows a0 a1), b one of 3 (row b0, one
padding token): keys a0 = 1/4, a1 = 3/4, b0 = 1/2 → rows a0 b0 a1; a0 = doc 0 tokens 0-3, b0 = b's doc 0-2,
a1 = doc 0 tokens 4-5 then doc 1 tokens 0-1.
"""

from __future__ import annotations

import numpy as np

from zephon.executor.step_arithmetic import sequences_in
from zephon.planner.best_fit import Bins

__all__ = ["homogeneous", "window_bound_rows"]


def homogeneous(tokens: np.ndarray, dataset_id: np.ndarray, max_length: int) -> Bins:
    """Rows for documents of ``tokens[p]`` tokens of dataset ``dataset_id[p]`` at plan positions ``p``."""
    L = int(max_length)
    tokens = np.asarray(tokens, dtype=np.int64)
    dataset_id = np.asarray(dataset_id, dtype=np.int64)
    ids = np.unique(dataset_id)
    rows_of = {}
    keys, owners, numbers = [], [], []
    for d in ids.tolist():
        total = int(tokens[dataset_id == d].sum())
        n = sequences_in(total, L)  # the dataset's own stream cut into rows
        rows_of[d] = n
        r = np.arange(n, dtype=np.int64)
        keys.append((2 * r + 1) / (2.0 * n) if n else np.empty(0))
        owners.append(np.full(n, d, np.int64))
        numbers.append(r)
    key, owner, number = (np.concatenate(x) if x else np.empty(0) for x in (keys, owners, numbers))
    order = np.lexsort((owner, key))  # by key, ties by dataset
    sequence_of = {}
    for d in ids.tolist():
        mine = order[owner[order] == d] if len(order) else order
        seq = np.empty(rows_of[d], np.int64)
        seq[number[mine].astype(np.int64)] = np.flatnonzero(owner[order] == d)
        sequence_of[d] = seq
    parts = []
    split = 0
    for d in ids.tolist():
        pos = np.flatnonzero((dataset_id == d) & (tokens > 0))
        t = tokens[pos]
        start = np.cumsum(t) - t  # in the dataset's own stream
        end = start + t
        first, last = start // L, (end - 1) // L
        count = last - first + 1
        split += int((count > 1).sum())
        doc = np.repeat(np.arange(len(pos)), count)
        row = first[doc] + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count))
        lo = np.maximum(start[doc], row * L)
        hi = np.minimum(end[doc], (row + 1) * L)
        parts.append((sequence_of[d][row], lo - row * L, pos[doc], lo - start[doc], hi - lo))
    if parts:
        seq, off, position, doc_start, length = (np.concatenate(c) for c in zip(*parts, strict=True))
    else:
        seq = off = position = doc_start = length = np.empty(0, np.int64)
    sort = np.lexsort((off, seq))
    sequences = int(sum(rows_of.values()))
    return Bins(
        sequence=seq[sort].astype(np.int64),
        offset=off[sort].astype(np.int32),
        position=position[sort].astype(np.int64),
        doc_start=doc_start[sort].astype(np.int32),
        length=length[sort].astype(np.int32),
        sequences=sequences,
        padding_tokens=sequences * L - int(tokens.sum()),
        split_documents=split,
        dropped_documents=0,
        dropped_tokens=0,
    )


def window_bound_rows() -> int:
    """Rows by which a dataset's count in any window of consecutive rows can miss its share: one per end."""
    return 2
