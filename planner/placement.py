"""Documents placed at consecutive plan positions: what the mixing stages hand the layout.

Both mixtures — by document counts (``zephon.planner.layout`` over ``zephon.planner.interleave``) and by
token counts (``zephon.planner.token_mix``) — produce the plan as a stream of placements: for a run of
consecutive positions, the dataset that supplies each one and which of its documents (from its
``zephon.planner.orders.Reader``) sits there. The layout turns them into samples.parquet's columns
(``layout.Chunk``: fixed dtypes, token offsets, lanes).

Invariant: the placements of a plan follow each other without gaps or overlaps (each starts where the
previous one stopped), a placement never spans two stages, and within each dataset the documents appear in
that dataset's reading order.

Example: weights a 0.5 / b 0.5 over a (one shard, id 0, of 2 rows) and b (one shard, id 1, of 3 rows),
``epochs=1``, seed 0: the plan's 6 positions come as one placement — ``stage = 0``,
``dataset_id = [0 1 0 1 0 1]``, ``shard_id = [0 1 0 1 0 1]``, ``row = [1 0 0 1 0 2]``,
``epoch = [0 0 0 0 1 0]`` (position 4 is the first document of a's second pass).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Placement(NamedTuple):
    """Documents at consecutive plan positions, one entry per position, all in one stage."""

    #: The stage (phase, ``zephon.planner.phases.Stage.index``) of every position; 0 without phases.
    stage: int
    #: The dataset supplying each position (int16).
    dataset_id: np.ndarray
    #: Global shard id of the document at each position (int32).
    shard_id: np.ndarray
    #: Its row within that shard (int32).
    row: np.ndarray
    #: The epoch (pass of its dataset, from 0) that reads it (int32).
    epoch: np.ndarray
    #: Its tokens (int64); None when the plan has no token counts.
    tokens: np.ndarray | None
