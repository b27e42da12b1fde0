"""The rows of a plan that packs samples by cost (``Pipeline.pack_samples``): which samples each row holds.

The planner grouped the samples into rows (``zephon.planner.best_fit`` over their costs) and wrote them to
bins.parquet: one piece per sample, sorted by (``sequence``, ``offset``) — ``sequence`` the row, ``offset`` the
cost of the row's earlier members, ``position`` the sample's plan position. A packed record run treats rows
the way a text run treats sequences: global step ``s`` is rows ``[s·G, (s+1)·G)``, rank ``r`` of ``D`` takes
rows ``r, r + D, …`` of each step, ``B`` per microbatch (``zephon.executor.geometry``).

``PlannedRows.members(rows)`` gives, for rows asked in increasing order, their members in row order: the row
(index into ``rows``) and plan position of each. A row's first member opened it, so it is the row's smallest
position, and rows open in plan order: positions asked for never go back past the first member of the
earliest row asked — what ``PlanPositions`` needs to read samples.parquet forward only.

Reading is by row group (``RowGroupIndex`` over ``sequence``, whose minima are in the footer): one lookup per
microbatch, a few row groups cached, so a resume at any step reads one row group of bins.parquet first.

Example: bins rows 0: positions [0 1 2 8], 1: [3 4 5 7], 2: [6 11]. ``members([0, 2])`` → row index
[0 0 0 0 1 1], positions [0 1 2 8 6 11]; ``first_position(1)`` → 3.
"""

from __future__ import annotations

import numpy as np

from zephon.errors import PlanFormatError
from zephon.executor.plan_reader import PlanBundle, RowGroupIndex


class PlannedRows:
    """Members of a packed record plan's rows, read from its bins.parquet."""

    def __init__(self, plan: PlanBundle) -> None:
        packing = plan.manifest.sample_packing
        bins = plan.checked.bins
        if packing is None or bins is None:
            raise PlanFormatError(
                f"plan {plan.manifest.config_hash[:12]} must have sample_packing and bins.parquet to run packed "
                "samples, got neither — re-plan with .pack_samples(max_cost=...)"
            )
        #: Rows in the plan.
        self.rows = packing.rows
        self._index = RowGroupIndex([bins], ["sequence", "position"])

    def _starts(self, rows: np.ndarray) -> np.ndarray:
        """Index in bins.parquet of each row's first piece (of the next row's, for ``rows`` past the last)."""
        before = self._index.find_many("sequence", np.asarray(rows, np.int64), side="left")  # last piece < row
        return before + 1

    def members(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row index into rows, plan position)`` of every member of ``rows`` (existing rows, increasing)."""
        if not len(rows):
            empty = np.zeros(0, np.int64)
            return empty, empty
        starts = self._starts(rows)
        ends = self._starts(rows + 1)
        counts = ends - starts
        pieces = np.repeat(starts - np.cumsum(np.concatenate(([0], counts[:-1]))), counts) + np.arange(counts.sum())
        found = self._index.rows(pieces.astype(np.int64))
        which = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
        if not np.array_equal(found["sequence"].astype(np.int64), np.asarray(rows, np.int64)[which]):
            raise PlanFormatError("bins.parquet must be sorted by sequence, got rows out of order — re-plan")
        return which, found["position"].astype(np.int64)

    def first_position(self, row: int) -> int:
        """The plan position of row ``row``'s first member (its smallest); 0 past the last row."""
        if row >= self.rows:
            return 0  # a run past its last step reads nothing
        start = int(self._starts(np.array([row]))[0])
        return int(self._index.rows(np.array([start], np.int64))["position"][0])
