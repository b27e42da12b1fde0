"""The order in which one dataset's documents are read in one epoch (pass).

Invariant: every epoch of a dataset is a permutation of all its (shard, row) pairs, derived only from
``(seed, dataset_index, epoch)`` through NumPy's version-stable SeedSequence and PCG64 raw bits; epochs
differ from each other and from other datasets' orders.

Algorithm (bounded memory, mostly sequential reads): shuffle the shard order, cut it into windows of
``window_shards`` consecutive shards, and shuffle the rows inside each window. The executor therefore needs
about one window of shards per dataset at a time, and reads each shard once per epoch.

Worked example: shards A (3 rows), B (2 rows), C (2 rows), window 2. The shard permutation might be C, A, B;
windows are [C, A] and [B]; the first window's 5 rows C0 C1 A0 A1 A2 might be shuffled into
A2 C0 A0 C1 A1, the second into B1 B0: the epoch reads A2 C0 A0 C1 A1 B1 B0.
"""

from __future__ import annotations

import numpy as np


def permutation(bits: np.random.PCG64, n: int) -> np.ndarray:
    """A permutation of ``range(n)`` from the raw 64-bit stream (stable argsort of ``n`` draws).

    NumPy guarantees that SeedSequence and PCG64 raw streams never change across versions; the convenience
    methods of ``Generator`` (``permutation``, ``shuffle``) carry no such promise, so plans avoid them.
    """
    return np.argsort(bits.random_raw(n), kind="stable")


def epoch_order(
    shard_ids: np.ndarray,
    shard_rows: np.ndarray,
    *,
    seed: int,
    dataset_index: int,
    epoch: int,
    shuffle: bool,
    window_shards: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(shard_id, row)`` arrays (int32) of one epoch of one dataset, in reading order."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, dataset_index, epoch]))
    order = permutation(bits, len(shard_ids)) if shuffle else np.arange(len(shard_ids))
    shard_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    for start in range(0, len(order), window_shards):
        window = order[start : start + window_shards]
        counts = shard_rows[window]
        shards = np.repeat(shard_ids[window], counts).astype(np.int32)
        # Row index within its shard: position minus the start of that shard's run.
        run_starts = np.repeat(np.cumsum(counts) - counts, counts)
        rows = (np.arange(int(counts.sum()), dtype=np.int64) - run_starts).astype(np.int32)
        if shuffle:
            perm = permutation(bits, len(rows))
            shards, rows = shards[perm], rows[perm]
        shard_parts.append(shards)
        row_parts.append(rows)
    if not shard_parts:
        return np.empty(0, np.int32), np.empty(0, np.int32)
    return np.concatenate(shard_parts), np.concatenate(row_parts)
