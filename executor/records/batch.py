"""``RecordBatch``: one microbatch of a record pipeline, and where each of its records sits in the plan.

A record pipeline maps the plan one record per position: row ``j`` of the global batch of step ``s`` is the
record at plan position ``s·G + j`` (``zephon.executor.geometry``: rank ``r`` of ``D`` takes rows ``r, r + D, …``
of the step, a microbatch of ``B`` of them at a time). ``sequences`` are the positions this microbatch stands
for; ``positions`` the records it holds, in the same order, without those dropped by an operator or skipped,
and without positions past the plan's end (the last step of a plan that ``G`` does not divide).

Example: G = 4, dp 2, B = 2, a plan of 6 records. Step 1 of rank 1 stands for positions [5, 7] and holds [5]
(7 is past the end); ``len(batch)`` is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordBatch:
    """The collated records of one microbatch (``data``) and their provenance.

    Attributes:
        data: what the collate returned (the default: a dict of tensors and lists; ``{}`` for no records).
        positions: plan positions of the records in ``data``, in order (int64).
        datasets: the dataset index (into the plan's datasets) of each record.
        sequences: the plan positions the microbatch stands for (its rows of the global batch).
        step, microbatch: its place in training (global step, microbatch within the step on this rank).
        row: packed plans (``Pipeline.pack_samples``) only: each record's row, an index into ``sequences`` (the
            plan rows the microbatch stands for); records of one row are consecutive, in the row's order.
    """

    data: Any
    positions: np.ndarray
    datasets: np.ndarray
    sequences: np.ndarray
    step: int = 0
    microbatch: int = 0
    row: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def rows(self) -> list[np.ndarray]:
        """Packed plans: the plan positions of each row's records, one array per row of ``sequences`` (empty for a
        row past the plan's end, or whose records were all dropped)."""
        if self.row is None:
            raise ConfigError("batch.rows() must be called on a packed record run, got an unpacked one — use positions")
        return [self.positions[self.row == k] for k in range(len(self.sequences))]

    def to_training(self, **options: Any) -> Any:
        """The collated data, as ``Pipeline.to_torch_dataset()`` hands it out (no options: a record batch is
        already what the collate made it)."""
        if options:
            raise ConfigError(
                f"to_training options must be none for a record pipeline, got {sorted(options)} — shape the batch "
                "in map_transform or .batch(collate=fn)"
            )
        return self.data
