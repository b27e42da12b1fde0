"""Which shards the plan reads next: the executor's view of future shard accesses, for the shard cache.

The plan lists every document, so the executor knows, for each shard, the plan positions where it will be
read. Reading only the ``shard_id`` column, one row group at a time, this builds for every shard the
sorted list of samples row groups that use it. ``next_use(shard, position)`` is the start of the first such
row group at or after ``position`` (row-group resolution is enough to order evictions), and
``upcoming(position, n)`` lists the next ``n`` distinct shards in plan order, for prefetching.

Example: row groups of 4 documents, shard ids [7 7 3 7 | 3 3 9 9 | 7 …]: uses = {7: [0, 2], 3: [0, 1],
9: [1]}; next_use(7, position 5) = 8 (row group 2), next_use(9, 9) = None; upcoming(4, 2) = [3, 9].
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


class ShardSchedule:
    """Future shard accesses of a plan, at samples row-group resolution."""

    def __init__(self, sample_files: list[Path], shard_ids: set[int] | None = None) -> None:
        self.group_start: list[int] = []
        self.group_shards: list[np.ndarray] = []
        self.uses: dict[int, list[int]] = {}
        start = 0
        for file in sample_files:
            pf = pq.ParquetFile(file)
            for g in range(pf.metadata.num_row_groups):
                ids = pf.read_row_group(g, columns=["shard_id"]).column(0).to_numpy()
                _, first = np.unique(ids, return_index=True)
                ordered = ids[np.sort(first)]
                if shard_ids is not None:
                    ordered = ordered[np.isin(ordered, list(shard_ids))]
                index = len(self.group_start)
                self.group_start.append(start)
                self.group_shards.append(ordered)
                for shard in ordered.tolist():
                    self.uses.setdefault(shard, []).append(index)
                start += len(ids)

    def _group(self, position: int) -> int:
        return max(0, bisect.bisect_right(self.group_start, position) - 1)

    def next_use(self, shard: int, position: int) -> int | None:
        groups = self.uses.get(shard, [])
        i = bisect.bisect_left(groups, self._group(position))
        return self.group_start[groups[i]] if i < len(groups) else None

    def upcoming(self, position: int, n: int) -> list[int]:
        out: list[int] = []
        for g in range(self._group(position), len(self.group_shards)):
            for shard in self.group_shards[g].tolist():
                if shard not in out:
                    out.append(shard)
                    if len(out) == n:
                        return out
        return out
