"""One dataset's per-row token counts, one array per shard, loaded when a shard is read.

A token mixture or an exact plan needs every document's token count, but only a window of shards at a time
(``orders.Reader`` concatenates the window's arrays) plus each dataset's total (``layout``). Holding every
array at once costs 8 bytes per row as int64: 8 GB at 10^9 rows. ``ShardTokens`` holds, per shard, a loader
instead — the count cache's ``.npy`` (exact counts), the byte-length cache times a ratio (estimates), a
Parquet column, or a generator (synthetic benchmarks) — so planning memory grows with the shuffle window, not
with the corpus.

Invariant: ``tokens[j]`` has ``rows[j]`` entries and is the same array every time it is loaded (a loader
reads content-keyed cache files or computes from the shard itself); a loaded array of the wrong length is a
``DatasetError`` naming the shard. Loaders are called again on every access (nothing is kept).

Example: two shards of 3 and 2 rows whose counts are cached as ``a.npy = [5, 7, 2]`` and ``b.npy = [4, 4]``:
``tokens = ShardTokens([lambda: np.load("a.npy"), lambda: np.load("b.npy")], rows=[3, 2], names=[...])``;
``tokens[1]`` reads ``b.npy`` → ``[4, 4]``, ``tokens.total()`` reads both → 22, ``tokens[1:]`` is a
``ShardTokens`` of the second shard alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np

from zephon.errors import DatasetError


class ShardTokens(Sequence[np.ndarray]):
    """Per-shard token-count arrays of one dataset (or any run of shards), each loaded when indexed."""

    def __init__(self, loaders: Sequence[Callable[[], np.ndarray]], *, rows: Sequence[int], names: Sequence[str]):
        if not len(loaders) == len(rows) == len(names):
            raise ValueError(f"loaders, rows and names must have one entry per shard, got {len(loaders)}, "
                             f"{len(rows)} and {len(names)} — pass them shard by shard")  # fmt: skip
        self._loaders, self._rows, self._names = list(loaders), [int(r) for r in rows], list(names)

    def __len__(self) -> int:
        return len(self._loaders)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> ShardTokens: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | ShardTokens:
        if isinstance(index, slice):
            return ShardTokens(self._loaders[index], rows=self._rows[index], names=self._names[index])
        array = np.asarray(self._loaders[index]())
        if array.ndim != 1 or len(array) != self._rows[index]:
            raise DatasetError(
                f"token counts of shard {self._names[index] or index} must have {self._rows[index]} rows, got "
                f"{array.shape[0] if array.ndim else 0} — the shard changed since it was scanned; re-plan"
            )
        return array

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[j] for j in range(len(self)))

    def total(self) -> int:
        """Σ of every shard's counts, loading one shard at a time."""
        return sum(int(a.sum(dtype=np.int64)) for a in self)
