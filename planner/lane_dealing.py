"""Dealing the documents of an estimated plan to packing lanes.

An estimated plan packs at train time, and packing is sequential: a row's content depends on every
document before it. To let ``D`` data-parallel ranks pack independently, documents are dealt to ``L`` lanes;
each lane is packed on its own, and a data-parallel size that divides ``L`` splits the lanes among ranks
without changing any row (docs/training.md).

The plan does not fix ``L``: it records each document's *deal* ``c`` (column ``deal``), the index of the
chunk of its unit stream described below, and a run packs ``c mod L``. By default ``L`` is the run's global
batch ``G`` — one lane per row of a step, so every ``D`` dividing ``G`` owns whole lanes and tokenizes only
its own documents; a plan made with ``lanes=N`` fixes ``L = N`` for every run (``D`` must divide ``N``).

Lanes should progress at the same speed in tokens, so that row ``k`` of every lane comes from the same
stretch of the plan and the executor never buffers one lane's documents while it reads ahead for another.
Each document gets a size in *units*: its estimated (or exact) tokens when the plan has them; otherwise
(sample mixtures planned without a tokenizer) its shard's bytes per row, ``ceil(shard bytes / rows)`` — a
length estimate that costs nothing (the scan knows both) and tracks document length across datasets and
shards. The plan's stream of units is cut into chunks of ``QUANTUM`` units, dealt round-robin; a document
goes to the lane of the chunk holding its middle unit: its deal is that chunk's index.

Invariant: every lane gets the documents whose middles fall in its chunks, so of the plan's first ``U`` units each
lane holds ``U / L`` plus a random walk — not a bound. At each chunk boundary a lane gains or loses up to half of
the document that crosses it, and a document longer than ``QUANTUM`` goes whole to the lane of its middle chunk
while the other chunks it spans deal nothing, moving that lane ahead of the others by up to its size; these steps
do not cancel. Relative to a lane's units the walk shrinks as ``1/√(U / (L × QUANTUM))``: synthetic documents of
1 to ``QUANTUM / 2`` units, 200,000 of them, ``L`` = 8: the lanes within 0.5 % of their mean (34 quanta of
6,249); 1 to ``3 × QUANTUM``: 1.5 %. On real text with code files of 10^5 tokens (741 documents longer than
``QUANTUM`` holding 35 % of a 24 M-token mixture's units) the lanes' planned units ranged 0.94-1.09 × their mean
at ``L`` = 8, 0.76-1.53 × at ``L`` = 64, 0.58-2.61 × at ``L`` = 256 (twenty-seventh session): the longest lane
sets the run's length (``executor/pack/run_length.py``), so the rest is padding. Dealing that balances the lanes
of the run's own ``L`` — which the plan does not know, the deal being one number for every ``L`` — is not done.

Example, L = 2, QUANTUM = 10, documents of 4, 4, 8, 3, 12 units: middles at 2, 6, 12, 17.5, 25 → deals
0, 0, 1, 1, 2 → lanes 0, 0, 1, 1, 0 (with L = 3: lanes 0, 0, 1, 1, 2).

``Dealer`` deals a plan that arrives in chunks, carrying the cumulative unit count from chunk to chunk, in
integers, so chunk boundaries never change a lane.
"""

from __future__ import annotations

import numpy as np

from zephon.plan.records import ShardRef

QUANTUM = 4096


def row_bytes(shards: tuple[tuple[ShardRef, ...], ...]) -> np.ndarray:
    """Units per document of a plan without token counts, indexed by global shard id: ``ceil(bytes / rows)``
    (at least 1)."""
    refs = sorted((r for group in shards for r in group), key=lambda r: r.shard_id)
    return np.array([max(1, -(-r.bytes // r.rows)) if r.rows else 1 for r in refs], dtype=np.int64)


class Dealer:
    """Deals of a plan handed over in consecutive chunks of per-document units."""

    def __init__(self, units: int = 0) -> None:
        #: Units dealt so far (a continued plan's new segment starts after its prefix's units).
        self._units = units

    def deal(self, units: np.ndarray) -> np.ndarray:
        """Deals (int64, non-decreasing) of the next chunk's documents, given their units (integers ≥ 0)."""
        # The middle unit C - u/2 is a half-integer, and for a whole QUANTUM
        # floor((C - u/2) / QUANTUM) = floor((C - ceil(u/2)) / QUANTUM).
        units = np.asarray(units, dtype=np.int64)
        cumulative = np.cumsum(units)
        cumulative += self._units
        if len(cumulative):
            self._units = int(cumulative[-1])
        cumulative -= (units + 1) // 2
        cumulative //= QUANTUM
        return cumulative
